"""The sidecar's HTTP/JSON endpoint (``POST /v1/call``) driven by a real HTTP client.

One sidecar per test: the pipeline (default policies, ``file_note`` needing approval), its gRPC server (to
compare answers with ``ExecuteTool``) and its HTTP/JSON endpoint on 127.0.0.1:0, under JWT authentication.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Status, ToolResult
from sidecar.errors import StoreUnavailableError
from sidecar.pipeline import Pipeline
from sidecar.server.http_json import HttpJsonEndpoint
from tests.integration.conftest import ServeInBackground
from tests.support import tools
from tests.support.http_json import serving_http_json
from tests.support.mcp import http_client
from tests.support.waiting import until

pytestmark = pytest.mark.integration

Tokens = Callable[..., str]
MAX_MESSAGE_BYTES = 64 * 1024


@dataclass
class World:
    """A running sidecar: its HTTP/JSON ``url``, its gRPC ``target`` and the tokens its callers use."""

    url: str
    target: str
    tokens: Tokens
    pipeline: Pipeline

    def token(self, sub: str = "alice", roles: tuple[str, ...] = ("developer",)) -> str:
        return self.tokens(sub=sub, roles=list(roles))

    async def post(self, body: Any = None, *, token: str | None = None, **sent: Any) -> httpx2.Response:
        """``body`` as JSON (or ``sent`` as given), with ``token`` (default: alice's; ``""``: none)."""
        token = self.token() if token is None else token
        async with http_client(token or None) as http:
            return await (http.post(self.url, **sent) if sent else http.post(self.url, json=body))


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Tokens) -> AsyncIterator[World]:
    settings = make_settings(auth=jwt_auth, http_json={"listen": "127.0.0.1:0"},
                             limits={"max_message_bytes": MAX_MESSAGE_BYTES})
    async with serving_http_json(settings, tmp_path) as served:
        yield World(served.endpoint.url, served.target, make_token, served.pipeline)


def _result(response: httpx2.Response) -> ToolResult:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return ToolResult.model_validate(response.json())


def _error(response: httpx2.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    return error


async def test_a_read_answers_its_typed_result_as_json(world: World) -> None:
    result = _result(await world.post({"tool": "echo", "arguments": {"text": "hi"}, "call_id": "call-7"}))
    assert result.status is Status.SUCCESS and result.data == {"text": "hi", "principal": "alice", "attempt": 1}
    assert result.meta.tool == "echo" and result.meta.policy_revision == world.pipeline.policy.revision


async def test_the_result_is_the_one_grpc_gives_for_the_same_call(world: World) -> None:
    over_http = _result(await world.post({"tool": "echo", "arguments": {"text": "same"}}))
    async with AsyncClient(world.target, token=world.token()) as client:
        over_grpc = await client.execute("echo", {"text": "same"})
    ignored = {"request_id", "duration_ms"}
    assert over_http.model_dump(exclude={"meta": ignored}) == over_grpc.model_dump(exclude={"meta": ignored})


async def test_a_keyed_write_runs_once_and_is_replayed(world: World) -> None:
    before = tools.CREATED.value
    call = {"tool": "create_note", "arguments": {"text": "a"}, "idempotency_key": "note-1"}
    first, again = _result(await world.post(call)), _result(await world.post(call))
    assert first.status is again.status is Status.SUCCESS and first.data == again.data == {"count": before + 1}
    assert (first.meta.idempotency_replayed, again.meta.idempotency_replayed) == (False, True)
    assert tools.CREATED.value == before + 1


@pytest.mark.parametrize(("call", "code", "field"), [
    ({"tool": "admin_console", "arguments": {"text": "x"}}, ErrorCode.TOOL_UNAVAILABLE, None),  # hidden from her
    ({"tool": "echo", "arguments": {"text": 7}}, ErrorCode.INVALID_ARGUMENT, "text"),  # the input model
    ({"tool": "create_note", "arguments": {"text": "a"}}, ErrorCode.INVALID_ARGUMENT, "idempotency_key"),
    ({"tool": "echo", "arguments": {"text": "a"}, "conversation_id": "a\x00b"}, ErrorCode.INVALID_ARGUMENT,
     "conversation_id"),  # the pipeline's field rules, as for gRPC
])
async def test_a_refused_call_is_a_result_with_its_error(world: World, call: dict[str, Any], code: ErrorCode,
                                                        field: str | None) -> None:
    result = _result(await world.post(call))
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.code is code and result.error.field == field


async def test_approval_required_is_a_result_with_the_preview(world: World) -> None:
    note = {"title": "t", "body": "b"}
    result = _result(await world.post({"tool": "file_note", "arguments": note, "idempotency_key": "n-1"}))
    assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None


@pytest.mark.parametrize(("sent", "status", "code", "field"), [
    ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "MALFORMED_JSON", None),
    ({"content": b'{"tool": NaN}', "headers": {"content-type": "application/json"}}, 400, "MALFORMED_JSON", None),
    ({"content": b"\xff\xfe", "headers": {"content-type": "application/json"}}, 400, "MALFORMED_JSON", None),
    ({"content": b"[" * 100_00 + b"]" * 100_00, "headers": {"content-type": "application/json"}}, 400,
     "MALFORMED_JSON", None),  # nested deeper than the parser goes
    ({"json": {"tool": "echo", "dry_run": True}}, 400, "UNKNOWN_FIELD", "dry_run"),
    ({"json": ["echo"]}, 400, "INVALID_REQUEST", None),
    ({"json": {"arguments": {}}}, 400, "INVALID_REQUEST", "tool"),
    ({"json": {"tool": "echo", "idempotency_key": 7}}, 400, "INVALID_REQUEST", "idempotency_key"),
    ({"content": b'{"tool": "echo"}', "headers": {"content-type": "text/plain"}}, 415, "UNSUPPORTED_MEDIA_TYPE",
     None),
    ({"content": b"{}"}, 415, "UNSUPPORTED_MEDIA_TYPE", None),  # no content type at all
])
async def test_a_request_it_cannot_take_is_a_typed_error(world: World, sent: dict[str, Any], status: int, code: str,
                                                         field: str | None) -> None:
    error = _error(await world.post(**sent), status)
    assert error["code"] == code and error["message"] and error.get("field") == field and not error["retryable"]


async def test_a_body_above_max_message_bytes_is_refused_declared_or_streamed(world: World) -> None:
    huge = {"tool": "echo", "arguments": {"text": "x" * MAX_MESSAGE_BYTES}}
    declared = _error(await world.post(huge), 413)
    assert declared["code"] == "PAYLOAD_TOO_LARGE" and str(MAX_MESSAGE_BYTES) in declared["message"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked, counted as it arrives
        yield b'{"tool": "echo", "arguments": {"text": "'
        for _ in range(MAX_MESSAGE_BYTES // 1024 + 1):
            yield b"x" * 1024
        yield b'"}}'

    streamed = _error(await world.post(content=chunks(), headers={"content-type": "application/json"}), 413)
    assert streamed["code"] == "PAYLOAD_TOO_LARGE"


@pytest.mark.parametrize(("authorization", "message"), [
    (None, "missing bearer token"),
    ("Bearer not-a-jwt", "invalid token"),
    ("Basic YWxpY2U6c2VjcmV0", "malformed authorization header"),
])
async def test_a_request_without_a_valid_bearer_token_is_refused(world: World, authorization: str | None,
                                                                message: str) -> None:
    before = tools.CREATED.value
    headers = {"Authorization": authorization} if authorization else {}
    async with http_client(headers=headers) as http:
        response = await http.post(world.url, json={"tool": "create_note", "idempotency_key": "k"})
    assert _error(response, 401) == {"code": "UNAUTHENTICATED", "message": message, "retryable": False}
    assert response.headers["www-authenticate"] == f'Bearer error="invalid_token", error_description="{message}"'
    assert tools.CREATED.value == before


async def test_an_expired_token_is_refused_before_the_body_is_read(world: World) -> None:
    expired = world.tokens(sub="alice", exp=1)
    error = _error(await world.post(content=b"{not json", headers={"content-type": "application/json"},
                                    token=expired), 401)
    assert error["code"] == "UNAUTHENTICATED"


async def test_other_paths_and_methods_are_typed_errors_too(world: World) -> None:
    async with http_client(world.token()) as http:
        got = await http.get(world.url)
        unknown = await http.post(world.url.replace("/v1/call", "/v1/nothing"), json={"tool": "echo"})
    assert _error(got, 405)["code"] == "METHOD_NOT_ALLOWED" and got.headers["allow"] == "POST"
    assert _error(unknown, 404)["code"] == "NOT_FOUND"


async def test_serve_runs_the_endpoint_the_settings_turn_on(serve_in_background: ServeInBackground,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    def url() -> str | None:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("HTTP/JSON calls on ")]
        return lines[0].removeprefix("HTTP/JSON calls on ") if lines else None

    with caplog.at_level(logging.INFO, logger="sidecar.server.http_json"):
        await serve_in_background(http_json={"listen": "127.0.0.1:0"})
        await until(lambda: url() is not None, what="the HTTP/JSON endpoint's start-up log")
    async with http_client() as http:  # dev mode on loopback: the static principal
        answer = await http.post(str(url()), json={"tool": "echo", "arguments": {"text": "via serve"}})
    assert _result(answer).data["text"] == "via serve"


async def test_a_call_in_flight_finishes_while_the_endpoint_stops(world: World, tmp_path: Path,
                                                                  make_settings: Callable[..., Settings]) -> None:
    endpoint = HttpJsonEndpoint.open(make_settings(http_json={"listen": "127.0.0.1:0"}), world.pipeline)
    await endpoint.start()
    tools.HOLD.close()  # whatever an earlier test left
    before = tools.HELD_STARTED.value
    async with http_client() as http:
        call = asyncio.create_task(http.post(endpoint.url, json={"tool": "held_note", "arguments": {"text": "a"},
                                                                 "idempotency_key": "held-1"}))
        await until(lambda: tools.HELD_STARTED.value > before, what="the held call to start")
        stopping = asyncio.create_task(endpoint.stop())
        port = int(endpoint.url.split(":")[2].split("/")[0])
        await until(lambda: not _accepts(port), what="the endpoint to stop taking connections")
        assert not call.done() and not stopping.done()  # the stop waits for the call in flight
        tools.HOLD.open()
        try:
            answer = await call
        finally:
            tools.HOLD.close()
        await stopping
    assert _result(answer).status is Status.SUCCESS


def _accepts(port: int) -> bool:
    """Whether 127.0.0.1:``port`` takes a connection."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class _Failing:
    """A gateway whose calls raise ``exc``: the store down, or a bug."""

    def __init__(self, exc: Exception) -> None:
        self._exc = exc

    async def execute(self, *args: Any, **kwargs: Any) -> ToolResult:
        raise self._exc


@pytest.mark.parametrize(("exc", "status", "code", "message", "retryable"), [
    (StoreUnavailableError("db down at 10.0.0.7"), 503, "UNAVAILABLE", "service unavailable", True),
    (RuntimeError("secret detail"), 500, "INTERNAL", "internal error", False),
])
async def test_a_failure_outside_the_result_is_its_fault_kind_without_its_details(
        make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture, exc: Exception, status: int,
        code: str, message: str, retryable: bool) -> None:
    endpoint = HttpJsonEndpoint.open(make_settings(http_json={"listen": "127.0.0.1:0"}),
                                     _Failing(exc))  # type: ignore[arg-type]
    await endpoint.start()
    try:
        async with http_client() as http:
            answer = await http.post(endpoint.url, json={"tool": "echo"})
    finally:
        await endpoint.stop()
    assert _error(answer, status) == {"code": code, "message": message, "retryable": retryable}
    logged = [r for r in caplog.records if r.name == "sidecar.server.http_json" and r.exc_info]
    assert len(logged) == (1 if code == "INTERNAL" else 0)  # a bug's traceback goes to the log, never the caller
