"""Every string field of every RPC, through a real server on SQLite and PostgreSQL (issue 8).

``ExecuteTool``'s fields are ``test_hostile_input``'s. Here: ``GetOperation`` (tool, idempotency_key,
request_id), ``ListTools`` (conversation_id), ``ApproveOperation`` (preview_id, preview_hash, comment)
and ``DenyOperation`` (preview_id, reason). A NUL, another control character or too many bytes is
INVALID_ARGUMENT naming the field, with the same message ``ExecuteTool`` gives (a gRPC status where
the answer has no error of its own, a refused ``ApprovalResult`` for the approval RPCs), and nothing
is written: no audit event, no decision on the preview. A comment or a reason is free text: line
breaks and tabs are fine there. ``ListPreviews`` (a number) and ``GetPolicyStatus`` (nothing) take no
string; ``test_fuzzing`` sends them bytes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.config import Settings
from sidecar.contract import PreviewState
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support import tools
from tests.support.approvals import NOTE, policy_dir
from tests.support.services import Services, serving

__all__ = ["jwt_auth", "make_settings", "make_token", "postgres", "postgres_dsn", "rsa_key", "socket_path"]

pytestmark = pytest.mark.integration

ID_RULE = "it must be 1-256 characters and at most 256 bytes of UTF-8, without control characters"
TOOL_RULE = "it must be 1-128 characters and at most 128 bytes of UTF-8, without control characters"
TEXT_RULE = "it must be at most 4096 bytes of UTF-8, without control characters other than line breaks and tabs"
CONTROL = "contains a control character"
# A malformed identifier, and what the message says is wrong with it.
BAD_IDS = [("a\x00b", CONTROL), ("\x01", CONTROL), ("del\x7f", CONTROL), ("c1\x9b", CONTROL), ("tab\there", CONTROL),
           ("line\nbreak", CONTROL), ("k" * 257, "is 257 bytes"), ("é" * 129, "is 258 bytes")]
BAD_TOOLS = [("create_note\x00", CONTROL), ("t" * 129, "is 129 bytes")]
BAD_TEXTS = [("fine\x00", CONTROL), ("bell\x07", CONTROL), ("esc\x1b[2J", CONTROL), ("\x7f", CONTROL),
             ("c" * 4097, "is 4097 bytes"), ("€" * 1366, "is 4098 bytes")]
FREE_TEXT = "looks right\r\nship it:\n\t- the title\n\t- the body"


class World:
    """A JWT sidecar with every service; alice calls tools, bob approves."""

    def __init__(self, services: Services, tokens: Callable[..., str]) -> None:
        self.services = services
        self.alice = (("authorization", f"Bearer {tokens(sub='alice', roles=['developer'])}"),)
        self.bob = (("authorization", f"Bearer {tokens(sub='bob', roles=['approver'])}"),)

    async def refused_status(self, method: Any, request: Any) -> str:
        """The details of the INVALID_ARGUMENT status ``method`` ends ``request`` with (as alice)."""
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await method(request, metadata=self.alice, timeout=10)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, caught.value
        return str(caught.value.details())

    async def pending_preview(self) -> pb.Preview:
        asked = await self.services.tools.ExecuteTool(pb.ExecuteToolRequest(
            tool="file_note", arguments_json=json.dumps(NOTE), idempotency_key="k-ask"),
            metadata=self.alice, timeout=10)
        assert asked.status == pb.STATUS_APPROVAL_REQUIRED, asked
        return asked.preview

    async def written(self) -> tuple[int, int]:
        """Audit events and idempotency records so far."""
        return len(await self.services.events()), await self.services.rows("idempotency")


@pytest.fixture(params=["sqlite", "postgres"])
async def world(request: pytest.FixtureRequest, tmp_path: Path, make_settings: Callable[..., Settings],
                jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> AsyncIterator[World]:
    store = {"postgres_dsn": request.getfixturevalue("postgres_dsn")} if request.param == "postgres" else {}
    policy = {"path": str(policy_dir(tmp_path / "policies")), "reload_interval_seconds": 0}
    settings = make_settings(auth=jwt_auth, policy=policy, **({"store": store} if store else {}))
    async with serving(settings, Registry.from_tools(tools.ALL)) as services:
        yield World(services, make_token)


def _invalid(result: pb.ApprovalResult) -> tuple[str, str]:
    assert not result.ok and result.HasField("error"), result
    assert result.error.code == pb.ERROR_CODE_INVALID_ARGUMENT, result
    return result.error.field, result.error.message


async def test_get_operation_refuses_every_malformed_field_and_finds_a_well_formed_one(world: World) -> None:
    get = world.services.tools.GetOperation
    stored = await world.services.tools.ExecuteTool(pb.ExecuteToolRequest(
        tool="create_note", arguments_json='{"text": "x"}', idempotency_key="k-1"), metadata=world.alice, timeout=10)
    before = await world.written()
    for value, problem in BAD_IDS:
        assert await world.refused_status(get, pb.GetOperationRequest(tool="create_note", idempotency_key=value)) \
            == f"idempotency_key {problem}: {ID_RULE}"
        assert await world.refused_status(get, pb.GetOperationRequest(request_id=value)) \
            == f"request_id {problem}: {ID_RULE}"
    for value, problem in BAD_TOOLS:
        assert await world.refused_status(get, pb.GetOperationRequest(tool=value, idempotency_key="k-1")) \
            == f"tool {problem}: {TOOL_RULE}"
        # a field that would not be looked up (request_id is given) is checked all the same
        assert await world.refused_status(get, pb.GetOperationRequest(tool=value, request_id="r")) \
            == f"tool {problem}: {TOOL_RULE}"
    assert await world.written() == before
    found = await get(pb.GetOperationRequest(tool="create_note", idempotency_key="k-1"), metadata=world.alice)
    by_request = await get(pb.GetOperationRequest(request_id=stored.meta.request_id), metadata=world.alice)
    assert found.state == by_request.state == pb.OPERATION_STATE_COMPLETED
    assert found.result.data_json == stored.data_json


async def test_list_tools_refuses_a_malformed_conversation_id(world: World) -> None:
    for value, problem in BAD_IDS:
        assert await world.refused_status(world.services.tools.ListTools, pb.ListToolsRequest(
            conversation_id=value)) == f"conversation_id {problem}: {ID_RULE}"
    listing = await world.services.tools.ListTools(pb.ListToolsRequest(conversation_id="conv-1"), metadata=world.alice)
    assert "echo" in [tool.name for tool in listing.tools]


async def test_approve_refuses_every_malformed_field_and_decides_nothing(world: World) -> None:
    preview, approve = await world.pending_preview(), world.services.approvals.ApproveOperation
    before = await world.written()
    answers = []
    for value, problem in BAD_IDS:
        answers.append((await approve(pb.ApproveOperationRequest(
            preview_id=value, preview_hash=preview.preview_hash), metadata=world.bob),
            "preview_id", f"preview_id {problem}: {ID_RULE}"))
        answers.append((await approve(pb.ApproveOperationRequest(
            preview_id=preview.preview_id, preview_hash=value), metadata=world.bob),
            "preview_hash", f"preview_hash {problem}: {ID_RULE}"))
    for value, problem in BAD_TEXTS:
        answers.append((await approve(pb.ApproveOperationRequest(
            preview_id=preview.preview_id, preview_hash=preview.preview_hash, comment=value), metadata=world.bob),
            "comment", f"comment {problem}: {TEXT_RULE}"))
    for result, field, message in answers:
        assert _invalid(result) == (field, message)
    assert await world.written() == before  # not audited, nothing stored
    record = await world.services.store.get_preview(preview.preview_id)
    assert record is not None and (record.state, record.decided_by, record.comment) == (PreviewState.PENDING, None,
                                                                                      None)
    approved = await approve(pb.ApproveOperationRequest(preview_id=preview.preview_id,
                                                        preview_hash=preview.preview_hash, comment=FREE_TEXT),
                             metadata=world.bob, timeout=10)
    assert approved.ok and approved.preview.comment == FREE_TEXT, approved
    assert len(await world.services.events()) == before[0] + 1  # the decision is audited


async def test_deny_refuses_every_malformed_field_and_decides_nothing(world: World) -> None:
    preview, deny = await world.pending_preview(), world.services.approvals.DenyOperation
    before = await world.written()
    for value, problem in BAD_IDS:
        result = await deny(pb.DenyOperationRequest(preview_id=value, reason="no"), metadata=world.bob)
        assert _invalid(result) == ("preview_id", f"preview_id {problem}: {ID_RULE}")
    for value, problem in BAD_TEXTS:
        result = await deny(pb.DenyOperationRequest(preview_id=preview.preview_id, reason=value), metadata=world.bob)
        assert _invalid(result) == ("reason", f"reason {problem}: {TEXT_RULE}")
    assert await world.written() == before
    record = await world.services.store.get_preview(preview.preview_id)
    assert record is not None and record.state is PreviewState.PENDING
    denied = await deny(pb.DenyOperationRequest(preview_id=preview.preview_id, reason=FREE_TEXT), metadata=world.bob,
                        timeout=10)
    assert denied.ok and denied.preview.state == pb.PREVIEW_STATE_DENIED and denied.preview.comment == FREE_TEXT
