"""The result contract through a real sidecar: every documented code from a handler with its safe details
(and nothing else of the handler's), partial successes stored and replayed, pages in ``meta``, and a
read retried after a hung attempt within its deadline while a write is never retried."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.config import Limits, Settings
from sidecar.contract import ErrorCode, OperationState, Recovery, Status
from tests.support import contract_tools
from tests.support.contract_tools import DELIVERIES, HUNG, OCCUPIED, RELEASE, UNAVAILABLE_WRITES
from tests.support.gated import World, gated
from tests.support.waiting import past

MAIL = {"recipients": [{"email": "ana@blocked.test"}, {"email": "bo@example.com"}], "subject": "hi", "body_text": "b"}


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str]) -> AsyncIterator[World]:
    async with gated(contract_tools.ALL, make_settings(auth=jwt_auth), make_token, tmp_path / "store.db") as w:
        yield w


async def test_a_policy_violation_reaches_the_model_with_its_safe_details_only(world: World) -> None:
    result = await world.agent.execute("check_mail", MAIL)
    assert result.status is Status.ERROR and result.error is not None
    error = result.error
    assert (error.code, error.retryable, error.recovery) == (ErrorCode.POLICY_VIOLATION, False,
                                                             Recovery.REQUEST_USER_INPUT)
    assert error.message == "a recipient's domain is blocked" and error.details == {"blocked_domains": ["blocked.test"]}
    assert "hunter2" not in result.model_dump_json()  # the cause's text never leaves the sidecar
    token = world.tokens(sub="alice", roles=["developer"])
    async with grpc.aio.insecure_channel(world.target) as channel:  # the wire form: details as a JSON object
        raw = await pb_grpc.ToolServiceStub(channel).ExecuteTool(
            pb.ExecuteToolRequest(tool="check_mail", arguments_json=json.dumps(MAIL)),
            metadata=(("authorization", f"Bearer {token}"),))
    assert raw.error.code == pb.ERROR_CODE_POLICY_VIOLATION
    assert json.loads(raw.error.details_json) == {"blocked_domains": ["blocked.test"]}


@pytest.mark.parametrize("code", [c.value for c in ErrorCode])
async def test_every_documented_code_of_a_handler_reaches_the_caller(world: World, code: str) -> None:
    result = await world.agent.execute("raise_code", {"code": code})
    assert result.error is not None and result.error.code is ErrorCode(code)
    assert result.error.message == f"failed with {code}" and result.error.details == {"code": code}


async def test_a_code_outside_the_set_is_an_internal_error_without_details(world: World) -> None:
    result = await world.agent.execute("raise_code", {"code": "ASSIGNEE_NOT_FOUND"})
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert result.error.details is None and "ASSIGNEE_NOT_FOUND" not in result.model_dump_json()


async def test_a_partial_delivery_is_a_partial_success_audited_stored_and_replayed(world: World) -> None:
    mail = {**MAIL, "recipients": [{"email": "ana@example.com"}, {"email": "x@refused.test"}]}
    before = DELIVERIES.value
    result = await world.agent.execute("deliver", mail, idempotency_key="mail-1")
    assert result.status is Status.PARTIAL_SUCCESS and result.error is None, result
    assert result.data == {"accepted": ["ana@example.com"]}
    [failed] = result.errors
    assert (failed.code, failed.retryable, failed.recovery) == (ErrorCode.PARTIAL_DELIVERY, False,
                                                                Recovery.DO_NOT_RETRY)
    assert failed.details == {"rejected": [{"email": "x@refused.test", "reason": "550 mailbox unavailable"}]}
    replay = await world.agent.execute("deliver", mail, idempotency_key="mail-1")
    assert replay.meta.idempotency_replayed and DELIVERIES.value == before + 1
    assert (replay.status, replay.data, replay.errors) == (result.status, result.data, result.errors)
    operation = await world.agent.get_operation(tool="deliver", idempotency_key="mail-1")
    assert operation.state is OperationState.COMPLETED and operation.result is not None
    assert operation.result.status is Status.PARTIAL_SUCCESS
    outcomes = [(e.status, e.error_code) for e in await world.store.audit_events() if e.tool == "deliver"]
    assert outcomes == [("dispatching", None), ("partial_success", "PARTIAL_DELIVERY"),
                        ("partial_success", "PARTIAL_DELIVERY")]
    whole = await world.agent.execute("deliver", {**mail, "recipients": [{"email": "ana@example.com"}]},
                                      idempotency_key="mail-2")
    assert whole.status is Status.SUCCESS and whole.errors == ()


async def test_pages_and_cuts_are_in_meta(world: World) -> None:
    first = await world.agent.execute("search_pages", {"query": "q"})
    assert first.status is Status.SUCCESS and first.data["next_cursor"] == "page-2"
    assert (first.meta.next_cursor, first.meta.has_more, first.meta.truncated) == ("page-2", True, False)
    last = await world.agent.execute("search_pages", {"query": "q", "cursor": first.meta.next_cursor})
    assert last.data == {"items": ["c"], "next_cursor": None, "has_more": False}
    assert (last.meta.next_cursor, last.meta.has_more) == (None, False)
    cut = await world.agent.execute("read_page", {"text": "0123456789"})
    assert (cut.data["content"], cut.meta.truncated, cut.meta.next_cursor) == ("01234", True, "5")
    whole = await world.agent.execute("read_page", {"text": "0123"})
    assert (whole.meta.truncated, whole.meta.next_cursor, whole.meta.has_more) == (False, None, False)


async def test_a_hung_read_is_retried_once_within_its_deadline(world: World) -> None:
    attempts, cancelled = HUNG.attempts.value, HUNG.cancelled.value
    started = time.monotonic()
    result = await world.agent.execute("hangs_once", {"text": "found"})
    assert result.status is Status.SUCCESS and result.data == {"text": "found on attempt 2"}, result
    assert result.meta.attempt == 2 and time.monotonic() - started < 10  # the tool's timeout
    assert (HUNG.attempts.value, HUNG.cancelled.value) == (attempts + 2, cancelled + 1)


async def test_a_write_is_never_retried(world: World) -> None:
    before = UNAVAILABLE_WRITES.value
    result = await world.agent.execute("write_unavailable", {"text": "t"}, idempotency_key="w-1")
    assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE and result.error.retryable
    assert result.meta.attempt == 1 and UNAVAILABLE_WRITES.value == before + 1


async def test_an_attempt_still_queued_at_its_own_deadline_waits_again_within_the_calls(
        tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
        make_token: Callable[..., str]) -> None:
    """With one handler thread busy, ``queued_read``'s attempt (0.2 s) ends queued: it never ran, so it queues
    again while the call's deadline (10 s) allows, instead of ending the call as if that deadline had passed."""
    async with gated(contract_tools.ALL, make_settings(auth=jwt_auth), make_token, tmp_path / "store.db",
                     Limits(sync_handler_threads=1)) as world:
        RELEASE.clear()
        occupied = OCCUPIED.value
        holder = asyncio.create_task(world.agent.execute("occupy", {"text": "busy"}))
        await OCCUPIED.reached(occupied + 1)
        queued = asyncio.create_task(world.agent.execute("queued_read", {"text": "found"}))
        await past(time.time() + 0.5)  # the first attempt's deadline, and more, while the thread stays busy
        assert not queued.done()
        RELEASE.set()
        result = await queued
        assert result.status is Status.SUCCESS and result.data == {"text": "found on attempt 1"}, result
        assert (await holder).status is Status.SUCCESS
