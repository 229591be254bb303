"""The sidecar's MCP endpoint (Streamable HTTP) driven by the MCP SDK's own ``ClientSession``.

One sidecar per test: the pipeline (default policies, ``file_note`` needing approval), its gRPC server
(for approvers, and to compare answers with ``ExecuteTool``) and its MCP endpoint on 127.0.0.1:0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from sidecar.bootstrap import assemble
from sidecar.client import AsyncClient
from sidecar.config import Limits, Settings
from sidecar.contract import ErrorCode, Recovery, Status
from sidecar.pipeline import Pipeline
from sidecar.server import Sidecar, create_server
from sidecar.server.mcp_http import McpEndpoint
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.approvals import NOTE, policies
from tests.support.mcp import http_client, http_session, typed
from tests.support.waiting import until

pytestmark = pytest.mark.integration

Tokens = Callable[..., str]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@dataclass
class World:
    """A running sidecar: its MCP endpoint ``url``, its gRPC ``target`` and the tokens its callers use."""

    url: str
    target: str
    tokens: Tokens
    pipeline: Pipeline
    endpoint: McpEndpoint

    def token(self, sub: str = "alice", roles: tuple[str, ...] = ("developer",)) -> str:
        return self.tokens(sub=sub, roles=list(roles))


@pytest.fixture
async def world(request: pytest.FixtureRequest, tmp_path: Path, make_settings: Callable[..., Settings],
                jwt_auth: dict[str, Any], make_token: Tokens) -> AsyncIterator[World]:
    """The sidecar; ``mcp`` settings besides ``listen`` come from an indirect parameter, if any."""
    settings = make_settings(auth=jwt_auth, mcp={"listen": "127.0.0.1:0", **getattr(request, "param", {})})
    store = await SqliteStore.open(tmp_path / "store.db")
    registry = Registry.from_tools([*tools.ALL, tools.held_note, tools.count_up])
    pipeline = assemble(registry=registry, policy=policies(tmp_path / "policies"), store=store, limits=Limits())
    sidecar: Sidecar | None = None
    endpoint = McpEndpoint.open(settings, pipeline)
    try:
        _, sidecar = await create_server(settings, pipeline, approvals=pipeline.approvals)
        await sidecar.start()
        await endpoint.start()
        yield World(endpoint.url, sidecar.addresses[-1], make_token, pipeline, endpoint)
    finally:
        await endpoint.stop()
        if sidecar is not None:
            await sidecar.stop(None)
        await pipeline.aclose()


async def test_tools_list_is_the_callers_listing_with_schemas_and_hints(world: World) -> None:
    async with http_session(world.url, world.token()) as developer:
        listed = {tool.name: tool for tool in (await developer.list_tools()).tools}
    async with http_session(world.url, world.token("root", ("admin",))) as admin:
        assert "admin_console" in {tool.name for tool in (await admin.list_tools()).tools}
    assert "admin_console" not in listed  # hidden by the availability policy
    echo, email = listed["echo"], listed["send_email"]
    assert echo.input_schema["properties"]["text"]["type"] == "string"
    assert echo.output_schema is not None and echo.output_schema["properties"]["data"]["anyOf"][0]["properties"][
        "principal"] == {"title": "Principal", "type": "string"}
    assert echo.annotations is not None and echo.annotations.read_only_hint is True
    assert email.annotations is not None
    assert (email.annotations.read_only_hint, email.annotations.destructive_hint, email.annotations.idempotent_hint,
            email.annotations.open_world_hint) == (False, True, False, True)
    assert email.meta == {"toolbooth/version": "1.0.0", "toolbooth/side_effect": "external_irreversible",
                          "toolbooth/requires_idempotency_key": True, "toolbooth/timeout_ms": 10000}


async def test_a_call_returns_the_typed_result_as_structured_content(world: World) -> None:
    async with http_session(world.url, world.token()) as session:
        answer = await session.call_tool("echo", {"text": "hi"}, meta={"toolbooth/call_id": "call-7"})
    result = typed(answer.structured_content)
    assert not answer.is_error and result.status is Status.SUCCESS
    assert result.data == {"text": "hi", "principal": "alice", "attempt": 1}
    assert result.meta.tool == "echo" and result.meta.policy_revision == world.pipeline.policy.revision
    assert json.loads(answer.content[0].text) == answer.structured_content  # type: ignore[union-attr]


async def test_progress_reports_reach_a_client_that_asks_for_them(world: World) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with http_session(world.url, world.token()) as session:
        reported = await session.call_tool("count_up", {"count": 50}, progress_callback=on_progress)
        unasked = await session.call_tool("count_up", {"count": 3})  # no progressToken: a unary call
    assert typed(reported.structured_content).data == {"count": 50}
    assert typed(unasked.structured_content).data == {"count": 3}
    assert seen and seen[-1] == (50, 50, "50 of 50")  # rate-limited, the last report always delivered
    assert [progress for progress, _, _ in seen] == sorted({progress for progress, _, _ in seen})
    assert len(seen) <= 50


async def _session_headers(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """The headers of a session opened by hand: ``initialize``, then ``notifications/initialized``."""
    opened = await http.post(url, json=INIT)
    headers = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    initialized = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert initialized.status_code == 202
    return headers


def _count_up(request_id: int, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": "count_up", "arguments": {"count": 3}, **({"_meta": meta} if meta else {})}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _events(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an event-stream answer, in order."""
    return [json.loads(line.removeprefix("data:")) for line in response.text.splitlines() if line.startswith("data:")]


async def test_a_call_is_answered_as_json_unless_it_asks_for_progress(world: World) -> None:
    """A POST without a ``progressToken`` gets one JSON body; one with a token an event stream carrying the
    progress notifications, then the response."""
    async with http_client(world.token(), ACCEPT) as http:
        headers = await _session_headers(http, world.url)
        plain = await http.post(world.url, json=_count_up(2), headers=headers)
        streamed = await http.post(world.url, json=_count_up(3, {"progressToken": "p-3"}), headers=headers)
        listed = await http.post(world.url, json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, headers=headers)
    assert plain.headers["content-type"] == "application/json" == listed.headers["content-type"]
    assert (plain.json()["id"], plain.json()["result"]["structuredContent"]["data"]) == (2, {"count": 3})
    assert "count_up" in {tool["name"] for tool in listed.json()["result"]["tools"]}
    assert streamed.headers["content-type"].startswith("text/event-stream")
    *notifications, response = _events(streamed)
    assert notifications and {note["method"] for note in notifications} == {"notifications/progress"}
    assert notifications[-1]["params"] == {"progressToken": "p-3", "progress": 3, "total": 3, "message": "3 of 3"}
    assert (response["id"], response["result"]["structuredContent"]["data"]) == (3, {"count": 3})


@pytest.mark.parametrize("world", [{"json_response": True}], indirect=True)
async def test_json_response_answers_even_a_call_asking_for_progress_as_json(world: World) -> None:
    async with http_client(world.token(), ACCEPT) as http:
        headers = await _session_headers(http, world.url)
        answer = await http.post(world.url, json=_count_up(2, {"progressToken": 7}), headers=headers)
    assert answer.headers["content-type"] == "application/json"  # the progress notifications are dropped
    assert answer.json()["result"]["structuredContent"]["data"] == {"count": 3}
    async with http_session(world.url, world.token()) as session:  # the SDK's client reads JSON answers as well
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        reported = await session.call_tool("count_up", {"count": 5}, progress_callback=on_progress)
    assert typed(reported.structured_content).data == {"count": 5} and seen == []


async def test_invalid_arguments_are_an_error_result_naming_the_field(world: World) -> None:
    async with http_session(world.url, world.token()) as session:
        answer = await session.call_tool("echo", {"text": 5})
    error = typed(answer.structured_content).error
    assert answer.is_error and error is not None
    assert (error.code, error.field, error.recovery, error.retryable) == (
        ErrorCode.INVALID_ARGUMENT, "text", Recovery.CORRECT_ARGUMENTS, False)
    assert error.message == "text: Input should be a valid string"


async def test_a_hidden_tool_is_answered_exactly_as_an_unknown_one(world: World) -> None:
    async with http_session(world.url, world.token()) as session:
        hidden = await session.call_tool("admin_console", {"text": "x"})
        unknown = await session.call_tool("no_such_tool", {"text": "x"})

    def shape(structured: dict[str, Any], name: str) -> str:
        meta = {**structured["meta"], "request_id": "-", "duration_ms": 0}
        return json.dumps({**structured, "meta": meta}).replace(name, "NAME")

    assert hidden.is_error and unknown.is_error
    assert shape(hidden.structured_content, "admin_console") == shape(unknown.structured_content, "no_such_tool")
    assert typed(hidden.structured_content).error.code is ErrorCode.TOOL_UNAVAILABLE  # type: ignore[union-attr]


async def test_a_keyed_write_runs_once_and_is_replayed(world: World) -> None:
    before = tools.CREATED.value
    key = {"toolbooth/idempotency_key": "note-1"}
    async with http_session(world.url, world.token()) as session:
        first = typed((await session.call_tool("create_note", {"text": "a"}, meta=key)).structured_content)
        again = typed((await session.call_tool("create_note", {"text": "a"}, meta=key)).structured_content)
    assert first.status is again.status is Status.SUCCESS and first.data == again.data == {"count": before + 1}
    assert (first.meta.idempotency_replayed, again.meta.idempotency_replayed) == (False, True)
    assert tools.CREATED.value == before + 1


async def test_a_write_without_a_key_gets_the_same_answer_as_over_grpc(world: World) -> None:
    async with http_session(world.url, world.token()) as session:
        answer = await session.call_tool("create_note", {"text": "a"})
    async with AsyncClient(world.target, token=world.token()) as client:
        over_grpc = await client.execute("create_note", {"text": "a"})
    assert answer.is_error
    assert typed(answer.structured_content).errors == over_grpc.errors
    assert over_grpc.error is not None and over_grpc.error.code is ErrorCode.INVALID_ARGUMENT
    assert over_grpc.error.field == "idempotency_key" and "idempotency_key is required" in over_grpc.error.message


async def test_approval_required_returns_the_preview_and_the_approved_call_runs(world: World) -> None:
    async with http_session(world.url, world.token()) as session:
        asked = await session.call_tool("file_note", NOTE, meta={"toolbooth/idempotency_key": "n-1"})
        preview = typed(asked.structured_content).preview
        assert asked.is_error and typed(asked.structured_content).status is Status.APPROVAL_REQUIRED
        assert preview is not None and json.loads(preview.call_json)["arguments"] == NOTE
        async with AsyncClient(world.target, token=world.token("bob", ("approver",))) as approver:
            assert (await approver.approve(preview.preview_id, preview.preview_hash)).ok
        done = await session.call_tool("file_note", NOTE, meta={"toolbooth/idempotency_key": "n-2",
                                                                "toolbooth/approval_id": preview.preview_id})
    assert not done.is_error and typed(done.structured_content).status is Status.SUCCESS


async def test_a_meta_field_that_is_not_a_string_is_a_protocol_error(world: World) -> None:
    async with http_session(world.url, world.token()) as session:
        with pytest.raises(MCPError, match="_meta toolbooth/idempotency_key must be a string") as raised:
            await session.call_tool("create_note", {"text": "a"}, meta={"toolbooth/idempotency_key": 7})
    assert raised.value.code == -32602  # INVALID_PARAMS


@pytest.mark.parametrize(("authorization", "message"), [
    (None, "missing bearer token"),
    ("Bearer not-a-jwt", "invalid token"),
    ("Basic YWxpY2U6c2VjcmV0", "malformed authorization header"),
])
async def test_a_request_without_a_valid_bearer_token_is_refused(world: World, authorization: str | None,
                                                                message: str) -> None:
    headers = {**ACCEPT, **({"Authorization": authorization} if authorization else {})}
    async with http_client(headers=headers) as http:
        response = await http.post(world.url, json=INIT)
    assert response.status_code == 401
    assert response.json() == {"error": "invalid_token", "error_description": message}
    assert response.headers["www-authenticate"] == f'Bearer error="invalid_token", error_description="{message}"'


async def test_an_expired_token_is_refused(world: World) -> None:
    expired = world.tokens(exp=int(time.time()) - 60)
    async with http_client(expired, ACCEPT) as http:
        response = await http.post(world.url, json=INIT)
    assert (response.status_code, response.json()["error_description"]) == (401, "token expired")


async def test_the_sdk_client_cannot_open_a_session_without_a_token(world: World) -> None:
    with pytest.raises(ExceptionGroup) as raised:
        async with http_session(world.url):
            pass
    assert raised.group_contains(MCPError, match="Server returned an error response", depth=2)


async def test_a_session_cannot_be_used_by_another_principal(world: World) -> None:
    async with http_client(world.token(), ACCEPT) as alice:
        opened = await alice.post(world.url, json=INIT)
    session_id = opened.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    headers = {**ACCEPT, "mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
    async with http_client(world.token("mallory"), headers) as mallory:
        response = await mallory.post(world.url, json=call)
    assert response.status_code == 404  # as if the session did not exist


async def test_a_foreign_host_header_is_refused_on_loopback(world: World) -> None:
    async with http_client(world.token(), {**ACCEPT, "Host": "evil.example"}) as http:
        response = await http.post(world.url, json=INIT)
    assert response.status_code == 421  # DNS rebinding protection


async def test_stop_lets_a_call_in_flight_finish_and_ends_open_sessions(world: World,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    tools.HOLD.close()
    started = tools.HELD_STARTED.value
    async with contextlib.AsyncExitStack() as client:
        session = await client.enter_async_context(http_session(world.url, world.token()))
        await session.list_tools()  # what the SDK client checks a result against, read before the server stops
        call = asyncio.create_task(session.call_tool("held_note", {"text": "x"},
                                                     meta={"toolbooth/idempotency_key": "held-1"}))
        await tools.HELD_STARTED.reached(started + 1)
        stopping = asyncio.create_task(world.endpoint.stop())
        async with asyncio.timeout(10):
            await world.endpoint.draining.wait()  # no new connections: it waits for the call
        assert not call.done() and not stopping.done()
        tools.HOLD.open()
        answer = await call
        await stopping
        client.push_async_exit(_server_gone)
    # the session's open event stream was ended, not waited for until uvicorn gave up and cancelled it
    assert "timeout graceful shutdown exceeded" not in caplog.text
    assert typed(answer.structured_content).status is Status.SUCCESS


async def _server_gone(kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> bool:
    """Closing a session whose server has stopped fails to reach it (to end the session): expected here."""
    return isinstance(error, ExceptionGroup) and error.subgroup(httpx2.ConnectError) is not None


async def test_serve_runs_the_endpoint_in_the_sidecars_loop_and_stops_within_the_grace(
    make_settings: Callable[..., Settings], socket_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from sidecar.bootstrap import serve

    caplog.set_level(logging.INFO, logger="sidecar.server.mcp_http")
    settings = make_settings(server={"listen": [f"unix://{socket_path}"], "shutdown_grace_seconds": 2},
                             mcp={"listen": "127.0.0.1:0"})
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop))
    try:
        await until(lambda: task.done() or "MCP (Streamable HTTP) listening on" in caplog.text,
                    what="the MCP endpoint listening")
        url = caplog.text.split("MCP (Streamable HTTP) listening on ")[1].split()[0]
        async with http_session(url) as session:  # dev mode: the static principal, on loopback
            answer = await session.call_tool("echo", {"text": "in-loop"})
        assert typed(answer.structured_content).data == {"text": "in-loop", "principal": "dev", "attempt": 1}
    finally:
        stop.set()
        async with asyncio.timeout(2 * settings.server.shutdown_grace_seconds + 5):  # MCP, then gRPC: each bounded
            await task


async def test_a_port_in_use_is_a_start_up_error_naming_the_setting(
    make_settings: Callable[..., Settings], make_pipeline: Any,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as raised:
            McpEndpoint.open(make_settings(mcp={"listen": f"127.0.0.1:{port}"}), await make_pipeline())
    assert str(raised.value) == f"cannot listen on mcp.listen 127.0.0.1:{port}: the port is in use (another process " \
                                "is listening there)"


async def test_a_client_of_the_sessionless_2026_protocol_gets_the_same_answers(world: World) -> None:
    """The SDK's high-level ``Client`` negotiates the newest protocol (no handshake, no session): every request
    is authenticated on its own and the ``_meta`` keys work the same."""
    key = {"toolbooth/idempotency_key": "modern-1"}
    async with http_client(world.token()) as http, \
            mcp.Client(streamable_http_client(world.url, http_client=http), mode="2026-07-28") as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        first = typed((await client.call_tool("create_note", {"text": "m"}, meta=key)).structured_content)
        again = typed((await client.call_tool("create_note", {"text": "m"}, meta=key)).structured_content)
    assert "echo" in listed and "admin_console" not in listed
    assert first.status is Status.SUCCESS and again.meta.idempotency_replayed and again.data == first.data
    async with http_client() as anonymous:
        response = await anonymous.post(world.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                        headers={**ACCEPT, "mcp-protocol-version": "2026-07-28"})
    assert response.status_code == 401


_REQUEST = '"jsonrpc":"2.0","method":"tools/list"'


@pytest.mark.parametrize(("body", "code", "says"), [
    ('{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"x":"\\ud800"}}}', -32700, "not one JSON"),
    ("[" * 5000 + "]" * 5000, -32700, "not one JSON"),
    (f"[{{{_REQUEST},\"id\":2}}]", -32600, "batches are not part of MCP"),
    ("[]", -32600, "batches are not part of MCP"),
    ("7", -32600, "one JSON object"),
    *[(f"{{{_REQUEST},\"id\":{bad}}}", -32600, "a string or an integer")
      for bad in ('{"a":1}', "[1]", "1.5", "true", "null")],
    ('{"jsonrpc":"1.0","id":3,"method":"tools/list"}', -32600, "not a JSON-RPC 2.0"),
])
async def test_a_body_that_is_not_one_json_rpc_message_is_answered_400_with_its_error(
    world: World, body: str, code: int, says: str,
) -> None:
    async with http_client(world.token(), ACCEPT) as http:
        headers = await _session_headers(http, world.url)
        in_session = await http.post(world.url, content=body, headers=headers)
        opening = await http.post(world.url, content=body)  # no session yet: none is opened
        listed = await http.post(world.url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, headers=headers)
    for answer in (in_session, opening):
        assert (answer.status_code, answer.headers["content-type"]) == (400, "application/json")
        error = answer.json()
        assert (error["id"], error["error"]["code"]) == (None, code) and says in error["error"]["message"]
        assert "validation error" not in answer.text and "mcp-session-id" not in answer.headers
    assert listed.status_code == 200 and listed.json()["id"] == 9  # the session goes on


def _held(request_id: int | str, key: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {
        "name": "held_note", "arguments": {"text": "x"}, "_meta": {"toolbooth/idempotency_key": key}}}


@pytest.mark.parametrize("progress", [False, True], ids=["json", "event-stream"])
async def test_a_request_id_in_flight_is_refused_before_anything_runs(world: World, progress: bool,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    tools.HOLD.close()
    started = tools.HELD_STARTED.value
    first_call = _held(5, "dup-1")
    if progress:
        first_call["params"]["_meta"]["progressToken"] = "p-5"
    async with http_client(world.token(), ACCEPT) as http:
        headers = await _session_headers(http, world.url)
        first = asyncio.create_task(http.post(world.url, json=first_call, headers=headers))
        await tools.HELD_STARTED.reached(started + 1)
        async with asyncio.timeout(30):  # before the fix, a duplicate ran too, and one POST was never answered
            duplicates = [await http.post(world.url, json=_held(same, "dup-2"), headers=headers) for same in (5, "5")]
            tools.HOLD.open()
            answered = await first
            again = await http.post(world.url, json={"jsonrpc": "2.0", "id": 5, "method": "tools/list"},
                                    headers=headers)
    for duplicate in duplicates:
        assert (duplicate.status_code, duplicate.json()["id"], duplicate.json()["error"]["code"]) == (409, None, -32600)
        assert "in flight in this session" in duplicate.json()["error"]["message"]
    assert tools.HELD_STARTED.value == started + 1  # exactly one execution
    result = _events(answered)[-1] if progress else answered.json()
    assert result["id"] == 5 and result["result"]["structuredContent"]["status"] == "success"
    assert again.status_code == 200 and again.json()["id"] == 5  # answered: the id is free again
    await world.endpoint.stop()
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING or record.exc_info]


async def test_a_cancelled_request_id_is_free_again(world: World) -> None:
    """A request the client cancelled (``notifications/cancelled``) is no longer in flight: its id can be used
    again."""
    tools.HOLD.close()
    started = tools.HELD_STARTED.value
    async with http_client(world.token(), ACCEPT) as http:
        headers = await _session_headers(http, world.url)
        first = asyncio.create_task(http.post(world.url, json=_held(6, "cancelled-1"), headers=headers))
        try:
            await tools.HELD_STARTED.reached(started + 1)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 6}}
            async with asyncio.timeout(30):
                assert (await http.post(world.url, json=cancel, headers=headers)).status_code == 202
                await first
                again = await http.post(world.url, json={"jsonrpc": "2.0", "id": 6, "method": "tools/list"},
                                        headers=headers)
        finally:
            tools.HOLD.open()
    assert again.status_code == 200 and again.json()["id"] == 6
