"""``ToolCalls``, what both adapters do with a tool call, through a real sidecar with JWT principals:
the approval of a call remembered for that exact call, and forgotten once denied."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, Status, ToolResult
from sidecar.integrations.calls import ToolCalls
from tests.support import tools
from tests.support.approvals import NOTE, policy_dir

pytestmark = pytest.mark.integration


class World:
    """The agent's ``ToolCalls`` (alice, a developer) and an approver's client (bob)."""

    def __init__(self, agent: AsyncClient, approver: AsyncClient) -> None:
        self.calls = ToolCalls(agent)
        self.approver = approver

    async def file_note(self, call_id: str, note: dict[str, str] = NOTE) -> ToolResult:
        return await self.calls.call("file_note", note, call_id, keyed=True)


@pytest.fixture
async def world(serve: Callable[..., Awaitable[str]], tmp_path: Path, jwt_auth: dict[str, Any],
                make_token: Callable[..., str]) -> AsyncIterator[World]:
    """``file_note`` needs approval (``tests.support.approvals``)."""
    target = await serve(auth=jwt_auth, policy={"path": str(policy_dir(tmp_path / "policies"))})
    async with (AsyncClient(target, token=make_token(sub="alice")) as agent,
                AsyncClient(target, token=make_token(sub="bob", roles=["approver"])) as approver):
        yield World(agent, approver)


def code(result: ToolResult) -> ErrorCode | None:
    return None if result.error is None else result.error.code


async def test_an_approved_call_runs_when_the_model_makes_it_again_and_its_repetition_replays(world: World) -> None:
    before = tools.CREATED.value
    held = await world.file_note("call_1")
    assert held.status is Status.APPROVAL_REQUIRED and held.preview is not None
    pending = await world.file_note("call_2")  # not approved yet: the same preview
    assert pending.status is Status.APPROVAL_REQUIRED and pending.preview == held.preview
    assert (await world.approver.approve(held.preview.preview_id, held.preview.preview_hash)).ok

    ran = await world.file_note("call_3", {"body": "at noon", "title": "launch"})  # the same call, keys reordered
    assert ran.status is Status.SUCCESS and not ran.meta.idempotency_replayed
    replayed = await world.file_note("call_3")  # the framework runs that tool call again
    assert replayed.status is Status.SUCCESS and replayed.meta.idempotency_replayed
    assert replayed.data == ran.data
    assert tools.CREATED.value == before + 1

    again = await world.file_note("call_4")  # a new call of the model: a new approval is needed
    assert again.status is Status.APPROVAL_REQUIRED and again.preview is not None
    assert again.preview.preview_id != held.preview.preview_id
    assert tools.CREATED.value == before + 1


async def test_a_denied_call_is_refused_once_then_a_new_preview_is_opened(world: World) -> None:
    held = await world.file_note("call_1")
    assert held.preview is not None
    assert (await world.approver.deny(held.preview.preview_id, reason="not today")).ok
    denied = await world.file_note("call_2")
    assert code(denied) is ErrorCode.PERMISSION_DENIED
    assert denied.error is not None and "not today" in denied.error.message
    fresh = await world.file_note("call_3")
    assert fresh.status is Status.APPROVAL_REQUIRED and fresh.preview is not None
    assert fresh.preview.preview_id != held.preview.preview_id


async def test_another_call_of_the_tool_is_not_given_the_approval(world: World) -> None:
    held = await world.file_note("call_1")
    assert held.preview is not None
    assert (await world.approver.approve(held.preview.preview_id, held.preview.preview_hash)).ok
    other = await world.file_note("call_2", {"title": "launch", "body": "at one"})
    assert other.status is Status.APPROVAL_REQUIRED and other.preview is not None
    assert other.preview.preview_id != held.preview.preview_id
