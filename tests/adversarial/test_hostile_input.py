"""Hostile request input through a real server (issue 8, defects 4, 8, 9, 10, 11).

- Arguments without a canonical JSON form (``NaN``, ``1e400``, lone surrogates, huge integers)
  are ``INVALID_ARGUMENT`` results naming the field, and audited; never gRPC INTERNAL.
- Undecodable request bytes are gRPC INVALID_ARGUMENT, never UNKNOWN.
- A NUL or a megabyte in a key or id is refused before anything is stored; the audit event
  holds a digest instead, and other callers' events are all written (SQLite and PostgreSQL).
- A handler raising ``SystemExit`` (async or sync) is an ``INTERNAL_ERROR`` result; the sidecar lives on.
- A seeded fuzzer (``TOOLBOOTH_FUZZ_REQUESTS``, default 20000; ``TOOLBOOTH_FUZZ_SEED``) finds no
  INTERNAL/UNKNOWN, no untyped answer and no execution of a malformed request.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.bootstrap import open_pipeline
from sidecar.config import Settings
from sidecar.pipeline import Pipeline
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.server.interceptors.status import UNDECODABLE_DETAILS
from sidecar.state import AuditEvent
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import make_settings, socket_path, start_sidecar
from tests.support import tools
from tests.support.tools import Counter, Echoed, Text

__all__ = ["make_settings", "postgres", "postgres_dsn", "socket_path", "start_sidecar"]

pytestmark = pytest.mark.integration

TALLY = Counter()
EXECUTE = "/toolbooth.v1.ToolService/ExecuteTool"


@tool(name="tally", version="1.0.0", side_effect=SideEffect.NONE)
async def tally(args: Text, ctx: ToolContext) -> Text:
    """Counts every execution: the fuzzer's malformed requests all aim here and must never run."""
    TALLY.bump()
    return args


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


HOSTILE = [tally, exit_async, exit_sync, own_cancel, interrupt_sync]


class Server:
    """A real sidecar over the real pipeline, and a raw channel to it."""

    def __init__(self, pipeline: Pipeline, channel: grpc.aio.Channel) -> None:
        self.pipeline, self.channel = pipeline, channel
        self.stub = pb_grpc.ToolServiceStub(channel)
        self.raw = channel.unary_unary(EXECUTE, request_serializer=None, response_deserializer=None)

    async def execute(self, **fields: Any) -> pb.ToolResult:
        return await self.stub.ExecuteTool(pb.ExecuteToolRequest(**fields), timeout=10)

    async def events(self) -> list[AuditEvent]:
        return await self.pipeline.store.audit_events()  # type: ignore[attr-defined, no-any-return]


async def _serve(settings: Settings, start_sidecar: Any) -> AsyncIterator[Server]:
    pipeline = await open_pipeline(settings, registry=Registry.from_tools([*tools.ALL, *HOSTILE]))
    try:
        sidecar = await start_sidecar(settings, pipeline)
        async with grpc.aio.insecure_channel(sidecar.addresses[0]) as channel:
            yield Server(pipeline, channel)
    finally:
        await pipeline.aclose()


@pytest.fixture
async def server(make_settings: Callable[..., Settings], start_sidecar: Any) -> AsyncIterator[Server]:
    async for built in _serve(make_settings(), start_sidecar):
        yield built


@pytest.fixture
async def pg_server(make_settings: Callable[..., Settings], start_sidecar: Any,
                    postgres_dsn: str) -> AsyncIterator[Server]:
    async for built in _serve(make_settings(store={"postgres_dsn": postgres_dsn}), start_sidecar):
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
        await server.raw(data, timeout=10)
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


# --- the fuzzer ---------------------------------------------------------------------------------

FUZZ_REQUESTS = int(os.environ.get("TOOLBOOTH_FUZZ_REQUESTS", "20000"))
FUZZ_SEED = int(os.environ.get("TOOLBOOTH_FUZZ_SEED", "8"))
_BAD_VALUES = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999", '"\\ud800"', '"a\\udc00"', "9007199254740993",
               "-18446744073709551616", "1" * 5000, '"\\u0000"']
_BAD_FIELDS = ["\x00", "a\x01b", "\x7f", "\x9b", "line\nbreak", "x" * 300, "é" * 200, "\U0001F600" * 70]
_ALPHABET = "ab \"\\{}[]:,0123456789.eE+-éλ\U0001F600\x00\ud7ff\ufffe"


def _malformed(rng: random.Random) -> pb.ExecuteToolRequest | bytes:
    """A request that must never execute (aimed at ``tally``), or raw bytes."""
    kind = rng.randrange(7)
    if kind == 0:  # a value with no canonical form, somewhere in the arguments
        value = rng.choice(_BAD_VALUES)
        for _ in range(rng.randrange(4)):
            value = rng.choice([f"[{value}]", f'{{"k": {value}}}', f'[1, "s", {value}]'])
        return pb.ExecuteToolRequest(tool="tally", arguments_json=f'{{"text": "x", "v": {value}}}')
    if kind == 1:  # broken JSON: random text or a truncated object
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(1, 40)))
        return pb.ExecuteToolRequest(tool="tally", arguments_json=rng.choice([text, '{"text": "' + text]))
    if kind == 2:  # a malformed string field
        name = rng.choice(["idempotency_key", "call_id", "conversation_id", "approval_id", "tool"])
        value = "".join(rng.sample(_BAD_FIELDS, 1)) + "".join(rng.choice("abc\x00") for _ in range(rng.randrange(5)))
        fields = {"tool": "tally", "arguments_json": '{"text": "x"}', name: value}
        return pb.ExecuteToolRequest(**fields)
    if kind == 3:  # the wrong shape for the model
        args = rng.choice(['{"text": 1}', '{"text": null}', '{}', '{"text": "x", "extra": 1}', "[]", '"x"', "1",
                           '{"text": {"a": [1, 2]}}', '{"text": "' + "y" * 10_001 + '"}'])
        return pb.ExecuteToolRequest(tool="tally", arguments_json=args)
    if kind == 4:  # too deep
        depth = rng.randrange(17, 300)
        return pb.ExecuteToolRequest(tool="tally", arguments_json='{"text": "x", "d": ' + "[" * depth + "]" * depth
                                     + "}")
    if kind == 5:  # undecodable bytes: a valid request with a byte made invalid UTF-8 inside a string
        data = bytearray(pb.ExecuteToolRequest(tool="tally", arguments_json='{"text": "abcdef"}').SerializeToString())
        data[rng.randrange(len(data) - 8, len(data))] = rng.choice([0xff, 0xc0, 0x80, 0xed])
        return bytes(data)
    return pb.ExecuteToolRequest(tool="", arguments_json='{"text": "x"}')  # no tool


def _well_formed(rng: random.Random) -> pb.ExecuteToolRequest:
    text = "".join(rng.choice("abc é\U0001F600\\\"\n\t\u2028") for _ in range(rng.randrange(20)))
    return pb.ExecuteToolRequest(tool="echo", arguments_json=json.dumps({"text": text}, ensure_ascii=rng.random() < .5),
                                 call_id=f"c-{rng.randrange(10**6)}")


async def test_fuzzed_requests_get_typed_answers_and_malformed_ones_never_run(server: Server) -> None:
    rng, start, before = random.Random(FUZZ_SEED), time.monotonic(), TALLY.value
    answered: dict[str, int] = {}

    async def send(request: pb.ExecuteToolRequest | bytes, malformed: bool) -> None:
        try:
            if isinstance(request, bytes):
                pb.ToolResult.FromString(await server.raw(request, timeout=30))
                raise AssertionError("undecodable bytes were answered")
            result = await server.stub.ExecuteTool(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details(), request)
            answered["INVALID_ARGUMENT status"] = answered.get("INVALID_ARGUMENT status", 0) + 1
            return
        assert result.status in (pb.STATUS_SUCCESS, pb.STATUS_ERROR), result
        if malformed:
            assert _error(result)[0] in ("ERROR_CODE_INVALID_ARGUMENT", "ERROR_CODE_TOOL_UNAVAILABLE"), request
        else:
            assert result.status == pb.STATUS_SUCCESS, (result, request)
        code = pb.ErrorCode.Name(result.error.code) if result.status == pb.STATUS_ERROR else "success"
        answered[code] = answered.get(code, 0) + 1

    sent = 0
    while sent < FUZZ_REQUESTS:
        batch = min(64, FUZZ_REQUESTS - sent)
        requests = [(_malformed(rng), True) if rng.random() < 0.9 else (_well_formed(rng), False)
                    for _ in range(batch)]
        await asyncio.gather(*(send(request, malformed) for request, malformed in requests))
        sent += batch
    assert sum(answered.values()) == FUZZ_REQUESTS
    assert TALLY.value == before, "a malformed request ran"
    assert len(answered) >= 4, answered  # every kind of answer was reached
    events = await server.events()
    assert len(events) == FUZZ_REQUESTS - answered.get("INVALID_ARGUMENT status", 0)
    assert all("\x00" not in (e.idempotency_key or "") + (e.call_id or "") + e.tool for e in events)
    assert time.monotonic() - start < 600
