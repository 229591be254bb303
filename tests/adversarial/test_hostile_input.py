"""Hostile request input through a real server (issue 8, defects 4, 8, 9, 10, 11).

- Arguments without a canonical JSON form (``NaN``, ``1e400``, lone surrogates, huge integers)
  are ``INVALID_ARGUMENT`` results naming the field, and audited; never gRPC INTERNAL.
- Undecodable request bytes are gRPC INVALID_ARGUMENT, never UNKNOWN.
- A NUL or a megabyte in a key or id is refused before anything is stored; the audit event
  holds a digest instead, and other callers' events are all written (SQLite and PostgreSQL).
- A handler raising ``SystemExit`` (async or sync) is an ``INTERNAL_ERROR`` result; the sidecar lives on.

The other RPCs' fields are ``test_request_fields``'; the seeded fuzzer of every RPC is ``test_fuzzing``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.config import Settings
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.server.interceptors.status import UNDECODABLE_DETAILS
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import make_settings, socket_path
from tests.support import tools
from tests.support.services import Services, serving
from tests.support.tools import Echoed, Text

__all__ = ["make_settings", "postgres", "postgres_dsn", "socket_path"]

pytestmark = pytest.mark.integration


@tool(name="exit_async", version="1.0.0", side_effect=SideEffect.NONE)
async def exit_async(args: Text, ctx: ToolContext) -> Text:
    raise SystemExit(3)


@tool(name="exit_sync", version="1.0.0", side_effect=SideEffect.NONE)
def exit_sync(args: Text, ctx: ToolContext) -> Text:
    raise SystemExit(4)


@tool(name="own_cancel", version="1.0.0", side_effect=SideEffect.NONE)
async def own_cancel(args: Text, ctx: ToolContext) -> Text:
    raise asyncio.CancelledError("not a cancellation of the call")


@tool(name="interrupt_sync", version="1.0.0", side_effect=SideEffect.NONE)
def interrupt_sync(args: Text, ctx: ToolContext) -> Text:
    raise KeyboardInterrupt


HOSTILE = [exit_async, exit_sync, own_cancel, interrupt_sync]


class Server(Services):
    """A real sidecar over the real pipeline."""

    async def execute(self, **fields: Any) -> pb.ToolResult:
        return await self.tools.ExecuteTool(pb.ExecuteToolRequest(**fields), timeout=10)


@asynccontextmanager
async def _serve(settings: Settings) -> AsyncIterator[Server]:
    async with serving(settings, Registry.from_tools([*tools.ALL, *HOSTILE])) as services:
        yield Server(services.pipeline, services.channel)


@pytest.fixture
async def server(make_settings: Callable[..., Settings]) -> AsyncIterator[Server]:
    async with _serve(make_settings()) as built:
        yield built


@pytest.fixture
async def pg_server(make_settings: Callable[..., Settings], postgres_dsn: str) -> AsyncIterator[Server]:
    async with _serve(make_settings(store={"postgres_dsn": postgres_dsn})) as built:
        yield built


def _error(result: pb.ToolResult) -> tuple[str, str]:
    assert result.status == pb.STATUS_ERROR, result
    return pb.ErrorCode.Name(result.error.code), result.error.field


# --- defect 9: arguments without a canonical form ---------------------------------------------

@pytest.mark.parametrize(("arguments", "field"), [
    ('{"text": NaN}', "text"), ('{"text": Infinity}', "text"), ('{"text": -Infinity}', "text"),
    ('{"text": 1e400}', "text"), ('{"text": "\\ud800"}', "text"), ('{"text": ["x", "a\\udfffb"]}', "text.1"),
    ('{"text": 9007199254740992}', "text"), ('{"\\ud800": "x"}', "\\ud800"),
    ('{"payload": {"deep": [1, NaN]}}', "payload.deep.1"),
])
async def test_arguments_without_a_canonical_form_are_invalid_and_audited(server: Server, arguments: str,
                                                                         field: str) -> None:
    tool_name = "nested" if "payload" in arguments else "echo"
    result = await server.execute(tool=tool_name, arguments_json=arguments)
    assert _error(result) == ("ERROR_CODE_INVALID_ARGUMENT", field)
    assert [(e.status, e.error_code) for e in await server.events()] == [("error", "INVALID_ARGUMENT")]


async def test_a_model_made_integer_beyond_the_canonical_range_is_invalid(server: Server) -> None:
    result = await server.execute(tool="slow", arguments_json='{"count": "99999999999999999999"}')
    assert _error(result) == ("ERROR_CODE_INVALID_ARGUMENT", "count")


# --- defect 10: undecodable bytes ---------------------------------------------------------------

@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x05\xff\xfe\xfd\xfc\xfb", b"\x12"])
async def test_undecodable_request_bytes_are_invalid_argument(server: Server, data: bytes) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.raw("ExecuteTool")(data, timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == UNDECODABLE_DETAILS
    assert (await server.execute(tool="echo", arguments_json='{"text": "still up"}')).status == pb.STATUS_SUCCESS


# --- defects 4 and 8: string fields -------------------------------------------------------------

@pytest.mark.parametrize("name", ["idempotency_key", "call_id", "conversation_id", "approval_id"])
@pytest.mark.parametrize("value", ["a\x00b", "tab\there", "x" * 257, "é" * 129, "k" * 1_000_000])
async def test_a_malformed_field_is_refused_and_audited_as_a_digest(server: Server, name: str, value: str) -> None:
    result = await server.execute(tool="create_note", arguments_json='{"text": "x"}', **{name: value})
    assert _error(result) == ("ERROR_CODE_INVALID_ARGUMENT", name)
    [event] = await server.events()
    assert (event.status, event.error_code) == ("error", "INVALID_ARGUMENT")
    stored = getattr(event, name) if name != "approval_id" else None
    assert stored is None or (stored.startswith("invalid:sha256:") and len(stored) < 100)
    assert len(repr(event)) < 4000 and "\x00" not in repr(event)


async def test_a_malformed_tool_name_is_unavailable_and_not_stored(server: Server) -> None:
    result = await server.execute(tool="echo\x00" + "x" * 200, arguments_json="{}")
    assert _error(result) == ("ERROR_CODE_TOOL_UNAVAILABLE", "tool")
    [event] = await server.events()
    assert event.tool.startswith("invalid:sha256:")


async def _one_bad_key_among_innocent_calls(server: Server) -> None:
    keys = [f"key-{n}" for n in range(19)] + ["bad\x00key"]
    results = await asyncio.gather(*(server.execute(tool="create_note", arguments_json='{"text": "x"}',
                                                    idempotency_key=key, call_id=key) for key in keys))
    assert [r.status for r in results[:-1]] == [pb.STATUS_SUCCESS] * 19
    assert _error(results[-1]) == ("ERROR_CODE_INVALID_ARGUMENT", "idempotency_key")
    events = await server.events()
    assert sorted(e.call_id or "" for e in events if e.status == "success") == sorted(keys[:-1])
    assert len([e for e in events if e.status == "dispatching"]) == 19
    assert [e.error_code for e in events if e.status == "error"] == ["INVALID_ARGUMENT"]


async def test_one_bad_key_costs_no_other_call_its_events(server: Server) -> None:
    await _one_bad_key_among_innocent_calls(server)


async def test_one_bad_key_costs_no_other_call_its_events_on_postgres(pg_server: Server) -> None:
    await _one_bad_key_among_innocent_calls(pg_server)


# --- defect 11: a handler's BaseException --------------------------------------------------------

@pytest.mark.parametrize("name", ["exit_async", "exit_sync", "own_cancel", "interrupt_sync"])
async def test_a_handler_raising_a_base_exception_is_an_internal_error(server: Server, name: str) -> None:
    result = await server.execute(tool=name, arguments_json='{"text": "x"}')
    assert _error(result) == ("ERROR_CODE_INTERNAL_ERROR", "")
    assert result.error.message == "the tool failed unexpectedly"
    again = await server.execute(tool="echo", arguments_json='{"text": "alive"}')
    assert Echoed.model_validate_json(again.data_json).text == "alive"
