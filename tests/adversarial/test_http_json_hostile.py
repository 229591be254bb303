"""A hostile caller of the HTTP/JSON endpoint (``POST /v1/call``): raw bytes on a socket, odd bodies, odd paths,
slow and many clients, duplicates of one keyed write and a stop while calls are in flight.

Every answer must be typed (a ``ToolResult`` or ``{"error": {...}}``), every call must go through the chain a gRPC
``ExecuteTool`` goes through (the same result, the same audit), and no client may make the sidecar run a write
twice, hang, leak or flood its log. The sidecar is the one ``tests/integration/test_http_json.py`` starts (JWT
authentication, the test tools), with its endpoint handle exposed to watch its connections and tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from sidecar.pipeline import Pipeline
from sidecar.server.http_json import HttpJsonEndpoint
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.http_json import serving_http_json
from tests.support.mcp import http_client
from tests.support.waiting import until

pytestmark = pytest.mark.integration

Tokens = Callable[..., str]
MAX_MESSAGE_BYTES = 64 * 1024
HEADER_TIMEOUT, REQUEST_TIMEOUT, MAX_CONNECTIONS = 3.0, 4.0, 8


@dataclass
class Hostile:
    """A running sidecar: its HTTP/JSON endpoint (and ``port``), its gRPC ``target``, its pipeline, tokens."""

    endpoint: HttpJsonEndpoint
    target: str
    tokens: Tokens
    pipeline: Pipeline

    @property
    def url(self) -> str:
        return self.endpoint.url

    @property
    def port(self) -> int:
        return int(self.url.split(":")[2].split("/")[0])

    def token(self, sub: str = "alice") -> str:
        return self.tokens(sub=sub, roles=["developer"])

    async def post(self, body: Any, *, token: str | None = None) -> httpx2.Response:
        async with http_client(self.token() if token is None else token) as http:
            return await http.post(self.url, json=body)

    async def raw(self, request: bytes, *, timeout: float = 10.0) -> bytes:
        """Send ``request`` as it is and read until the sidecar closes the connection (within ``timeout``)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(request)
            await writer.drain()
            async with asyncio.timeout(timeout):
                return await reader.read()
        finally:
            writer.close()

    def head(self, body: bytes, *, path: str = "/v1/call", extra: str = "", close: bool = True,
             token: str | None = None) -> bytes:
        """A whole request of ``body`` to ``path``, with ``token`` (default: alice's)."""
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token or self.token()}",
                 "Content-Type: application/json", f"Content-Length: {len(body)}"]
        if close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode("latin-1") + body

    async def audit(self) -> list[Any]:
        """The audit events the store holds, oldest first."""
        await self.pipeline.store.flush_audit()
        return list(await self.pipeline.store.audit_records())

    async def idle(self) -> None:
        """Wait until the endpoint serves no request and holds no connection."""
        state = self.endpoint._server.server_state
        await until(lambda: not state.tasks and not state.connections, what="the endpoint to be idle")


@pytest.fixture
async def hostile(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                  make_token: Tokens) -> AsyncIterator[Hostile]:
    settings = make_settings(auth=jwt_auth, limits={"max_message_bytes": MAX_MESSAGE_BYTES},
                             http_json={"listen": "127.0.0.1:0", "http": {
                                 "header_timeout_seconds": HEADER_TIMEOUT, "request_timeout_seconds": REQUEST_TIMEOUT,
                                 "max_connections": MAX_CONNECTIONS}})
    async with serving_http_json(settings, tmp_path) as served:
        yield Hostile(served.endpoint, served.target, make_token, served.pipeline)


def _split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, the headers (lower-case names) and the body of one raw HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def _typed_error(answer: bytes, status: int) -> dict[str, Any]:
    got, headers, body = _split(answer)
    assert got == status, answer[:300]
    assert headers.get("content-type") == "application/json", answer[:300]
    error: dict[str, Any] = json.loads(body)["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    return error


def _result(response: httpx2.Response) -> ToolResult:
    assert response.status_code == 200, response.text
    return ToolResult.model_validate(response.json())


# --- bodies -----------------------------------------------------------------------------------------------------


async def test_an_unknown_key_with_a_lone_surrogate_is_a_typed_error(hostile: Hostile) -> None:
    answer = await hostile.raw(hostile.head(b'{"tool": "echo", "\\ud800": 1}'))
    error = _typed_error(answer, 400)
    assert error["code"] == "UNKNOWN_FIELD" and error["field"].startswith("invalid:sha256:")  # as audited


async def test_a_huge_unknown_key_is_a_typed_error(hostile: Hostile) -> None:
    key = "k" * 30_000
    answer = await hostile.raw(hostile.head(json.dumps({"tool": "echo", key: 1}).encode()))
    error = _typed_error(answer, 400)
    assert error["code"] == "UNKNOWN_FIELD" and key not in error["message"] and len(answer) < 1000


@pytest.mark.parametrize("body", [
    b'{"tool": "\\ud800"}', b'{"tool": "ec\\u0000ho"}', b'{"tool": "echo", "arguments": {"\\udfff": "x"}}',
    b'{"tool": "echo", "arguments": {"text": "a"}, "conversation_id": "\\ud800"}',
    b'{"tool": "echo", "arguments": {"text": "a"}, "call_id": "a\\u0007b"}',
    b'{"tool": "echo", "arguments": {"text": "a"}, "idempotency_key": "' + b"k" * 5000 + b'"}',
])
async def test_bad_strings_in_the_body_are_refused_results_audited_as_over_grpc(hostile: Hostile,
                                                                              body: bytes) -> None:
    before = len(await hostile.audit())
    answer = await hostile.raw(hostile.head(body))
    status, headers, payload = _split(answer)
    assert status == 200 and headers["content-type"] == "application/json", answer[:300]
    result = ToolResult.model_validate_json(payload)
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.code in {ErrorCode.INVALID_ARGUMENT, ErrorCode.TOOL_UNAVAILABLE}
    assert len(await hostile.audit()) == before + 1  # the refused call is audited, its bad value replaced


@pytest.mark.parametrize("number", ["9" * 5000, "-" + "1" * 4301, "1e400", "-1E+999", "[0, 1e400]"])
async def test_a_number_python_does_not_read_as_written_is_refused_as_over_grpc(hostile: Hostile, number: str) -> None:
    arguments = '{"text": ' + number + "}"
    async with AsyncClient(hostile.target, token=hostile.token()) as client:
        over_grpc = await client.execute("echo", arguments)
    assert over_grpc.status is Status.ERROR and over_grpc.error is not None
    before = len(await hostile.audit())
    answer = await hostile.raw(hostile.head(('{"tool": "echo", "arguments": ' + arguments + "}").encode()))
    status, _, payload = _split(answer)
    assert status == 200, answer[:300]
    over_http = ToolResult.model_validate_json(payload)
    assert over_http.error is not None and over_http.error.code is over_grpc.error.code
    assert over_http.error.message == over_grpc.error.message
    assert len(await hostile.audit()) == before + 1


@pytest.mark.parametrize(("body", "code"), [
    (b'{"tool": "echo", "tool": 7}', "INVALID_REQUEST"),  # the last of duplicate keys, as json reads them
    (b'{"tool": "echo", "arguments": {}, "approval_id": ["a"]}', "INVALID_REQUEST"),
    (b'{"tool": "echo", "conversation_id": {"a": 1}}', "INVALID_REQUEST"),
    (b'{"tool": "echo", "call_id": true}', "INVALID_REQUEST"),
    (b'"echo"', "INVALID_REQUEST"), (b"null", "INVALID_REQUEST"), (b"42", "INVALID_REQUEST"),
    (b"", "MALFORMED_JSON"), (b"   ", "MALFORMED_JSON"), (b'\xef\xbb\xbf{"tool": "echo"}', "MALFORMED_JSON"),
    (b'{"tool": "echo"}{"tool": "echo"}', "MALFORMED_JSON"), (b'{"tool": "echo", "arguments": Infinity}',
                                                              "MALFORMED_JSON"),
])
async def test_a_body_of_the_wrong_shape_is_a_typed_error(hostile: Hostile, body: bytes, code: str) -> None:
    error = _typed_error(await hostile.raw(hostile.head(body)), 400)
    assert error["code"] == code and error["retryable"] is False


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON",
                                          "application/json ; charset=UTF-8"])
async def test_json_with_parameters_or_any_case_is_taken(hostile: Hostile, content_type: str) -> None:
    body = b'{"tool": "echo", "arguments": {"text": "ct"}}'
    answer = await hostile.raw(hostile.head(body).replace(b"Content-Type: application/json",
                                                          f"Content-Type: {content_type}".encode()))
    status, _, payload = _split(answer)
    assert status == 200 and ToolResult.model_validate_json(payload).status is Status.SUCCESS


@pytest.mark.parametrize("content_type", ["application/json-patch+json", "text/json",
                                          "application/x-www-form-urlencoded", "application/json, text/plain"])
async def test_other_media_types_are_refused(hostile: Hostile, content_type: str) -> None:
    answer = await hostile.raw(hostile.head(b'{"tool": "echo"}').replace(
        b"Content-Type: application/json", f"Content-Type: {content_type}".encode()))
    assert _typed_error(answer, 415)["code"] == "UNSUPPORTED_MEDIA_TYPE"


async def test_a_declared_100_mb_body_is_refused_before_it_is_read(hostile: Hostile) -> None:
    head = hostile.head(b"", close=False).replace(b"Content-Length: 0", b"Content-Length: 104857600")
    reader, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
    try:
        writer.write(head + b'{"tool": ')
        async with asyncio.timeout(10):
            line = await reader.readuntil(b"\r\n\r\n")
        assert line.startswith(b"HTTP/1.1 413 ")
        async with asyncio.timeout(10):  # the rest never comes: the request deadline closes the connection
            await reader.read()
    finally:
        writer.close()


# --- paths, methods, protocol --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/call/", "/v1/call%2f", "/v1/call%2F"])
async def test_a_trailing_slash_is_not_found_rather_than_redirected(hostile: Hostile, path: str) -> None:
    request = hostile.head(b'{"tool": "echo"}', path=path).replace(b"Host: 127.0.0.1", b"Host: evil.example")
    answer = await hostile.raw(request)
    assert b"evil.example" not in answer
    assert _typed_error(answer, 404)["code"] == "NOT_FOUND"


@pytest.mark.parametrize("path", ["/v1//call", "/v1/../v1/call", "//v1/call", "/V1/CALL", "/v1/call/..",
                                  "/v1/./call", "*", "/v1/call;x"])
async def test_other_paths_are_typed_not_found(hostile: Hostile, path: str) -> None:
    answer = await hostile.raw(hostile.head(b'{"tool": "echo"}', path=path))
    assert _typed_error(answer, 404)["code"] == "NOT_FOUND"


@pytest.mark.parametrize("method", ["PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT", "BREW"])
async def test_other_methods_are_typed_and_run_nothing(hostile: Hostile, method: str) -> None:
    before = tools.CREATED.value
    body = b'{"tool": "create_note", "arguments": {"text": "m"}, "idempotency_key": "m-1"}'
    answer = await hostile.raw(hostile.head(body).replace(b"POST ", f"{method} ".encode(), 1))
    assert _typed_error(answer, 405)["code"] == "METHOD_NOT_ALLOWED"
    assert tools.CREATED.value == before


async def test_a_query_string_is_ignored_and_never_carries_the_token(hostile: Hostile) -> None:
    body = b'{"tool": "echo", "arguments": {"text": "q"}}'
    request = hostile.head(body, path=f"/v1/call?access_token={hostile.token()}")
    without_header = b"\r\n".join(line for line in request.split(b"\r\n") if not line.startswith(b"Authorization"))
    error = _typed_error(await hostile.raw(without_header), 401)
    assert error["code"] == "UNAUTHENTICATED"
    status, _, payload = _split(await hostile.raw(hostile.head(body, path="/v1/call?x=1&tool=admin_console")))
    assert status == 200 and ToolResult.model_validate_json(payload).data["text"] == "q"


async def test_http_1_0_and_pipelined_requests_are_each_answered_once(hostile: Hostile) -> None:
    body = b'{"tool": "echo", "arguments": {"text": "p"}}'
    old = hostile.head(body).replace(b"HTTP/1.1\r\n", b"HTTP/1.0\r\n", 1)
    status, _, payload = _split(await hostile.raw(old))
    assert status == 200 and ToolResult.model_validate_json(payload).status is Status.SUCCESS
    pipelined = hostile.head(body, close=False) * 4 + hostile.head(body)
    answers = await hostile.raw(pipelined)
    assert answers.count(b"HTTP/1.1 200 OK") == 5 and answers.count(b'"status":"success"') == 5


@pytest.mark.parametrize("extra", ["Content-Length: 3\r\n", "Content-Length: -1\r\n"])
async def test_a_request_http_cannot_parse_is_a_typed_error(hostile: Hostile, extra: str) -> None:
    answer = await hostile.raw(hostile.head(b'{"tool": "echo"}', extra=extra))
    assert _typed_error(answer, 400)["code"] == "INVALID_REQUEST"


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:80", "127.0.0.1.attacker.example"])
async def test_dev_mode_refuses_a_request_naming_another_host(hostile: Hostile,
                                                              make_settings: Callable[..., Settings],
                                                              host: str) -> None:
    endpoint = HttpJsonEndpoint.open(make_settings(http_json={"listen": "127.0.0.1:0"}), hostile.pipeline)
    await endpoint.start()
    before = tools.CREATED.value
    try:
        async with http_client(headers={"Host": host, "Origin": f"http://{host}"}) as http:
            answer = await http.post(endpoint.url, json={"tool": "create_note", "arguments": {"text": "rebound"},
                                                         "idempotency_key": f"rebind-{host}"})
    finally:
        await endpoint.stop()
    assert tools.CREATED.value == before, "a page on another host ran a write as the dev principal"
    assert answer.status_code in {403, 421} and answer.headers["content-type"] == "application/json"


async def test_dev_mode_refuses_a_page_of_another_origin(hostile: Hostile,
                                                       make_settings: Callable[..., Settings]) -> None:
    endpoint = HttpJsonEndpoint.open(make_settings(http_json={"listen": "127.0.0.1:0"}), hostile.pipeline)
    await endpoint.start()
    before = tools.CREATED.value
    try:
        async with http_client(headers={"Origin": "http://attacker.example"}) as http:
            answer = await http.post(endpoint.url, json={"tool": "create_note", "arguments": {"text": "origin"},
                                                         "idempotency_key": "origin-1"})
    finally:
        await endpoint.stop()
    assert tools.CREATED.value == before
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "FORBIDDEN_ORIGIN"


async def test_dev_mode_serves_a_loopback_host(hostile: Hostile, make_settings: Callable[..., Settings]) -> None:
    endpoint = HttpJsonEndpoint.open(make_settings(http_json={"listen": "127.0.0.1:0"}), hostile.pipeline)
    await endpoint.start()
    try:
        async with http_client(headers={"Authorization": "Bearer whatever"}) as http:
            answer = await http.post(endpoint.url, json={"tool": "echo", "arguments": {"text": "dev"}})
    finally:
        await endpoint.stop()
    assert _result(answer).data["principal"] == "dev"


async def test_a_head_past_its_bound_is_a_typed_error(hostile: Hostile) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
    try:
        writer.write(b"POST /v1/call HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100_000)  # never completed
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
    finally:
        writer.close()
    assert _split(answer)[0] in {400, 431}
    assert _typed_error(answer, _split(answer)[0])["code"]


# --- tokens ----------------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    import base64
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.parametrize("forge", ["none", "signature", "expired", "not_yet", "no_sub", "audience", "huge"])
async def test_a_forged_or_stale_token_runs_nothing_and_is_typed(hostile: Hostile, forge: str) -> None:
    good = hostile.token()
    header, payload, signature = good.split(".")
    token = {
        "none": _b64(b'{"alg":"none","typ":"JWT"}') + "." + payload + ".",
        "signature": f"{header}.{payload}.{signature[:-6]}AAAAAA",
        "expired": hostile.tokens(sub="alice", exp=1),
        "not_yet": hostile.tokens(sub="alice", nbf=4_000_000_000),
        "no_sub": hostile.tokens(sub=None),
        "audience": hostile.tokens(sub="alice", aud="someone-else"),
        "huge": "a" * 100_000,
    }[forge]
    before, audited = tools.CREATED.value, len(await hostile.audit())
    body = json.dumps({"tool": "create_note", "arguments": {"text": "t"}, "idempotency_key": f"t-{forge}"}).encode()
    # the forged token given as it is: a token minted again would differ from ``good`` once a second turned
    error = _typed_error(await hostile.raw(hostile.head(body, token=token)), 401)
    assert error["code"] == "UNAUTHENTICATED" and error["retryable"] is False
    assert tools.CREATED.value == before and len(await hostile.audit()) == audited


# --- the same chain as ExecuteTool ------------------------------------------------------------------------------


_IGNORED = {"request_id", "duration_ms"}


@pytest.mark.parametrize("call", [
    {"tool": "admin_console", "arguments": {"text": "x"}},
    {"tool": "no_such_tool", "arguments": {}},
    {"tool": "echo", "arguments": {"text": 7}},
    {"tool": "echo", "arguments": {"text": "a", "extra": 1}},
    {"tool": "echo", "arguments": {"text": "a"}, "conversation_id": "a\x00b"},
    {"tool": "echo", "arguments": {"text": "a"}, "call_id": "c" * 257},
    {"tool": "ec\u200bho", "arguments": {"text": "a"}},
    {"tool": "create_note", "arguments": {"text": "a"}},
    {"tool": "create_note", "arguments": {"text": "a"}, "idempotency_key": "k\u0085"},
    {"tool": "file_note", "arguments": {"title": "t", "body": "b"}, "idempotency_key": "chain-1",
     "approval_id": "forged"},
    {"tool": "send_email", "arguments": {"text": "a"}, "idempotency_key": "chain-2"},
    {"tool": "boom", "arguments": {"text": "a"}},
    {"tool": "slow", "arguments": {"count": 1000}},
    {"tool": "echo", "arguments": {"text": "a" * 60_000}},
])
async def test_a_call_gets_the_result_and_the_audit_grpc_gives_it(hostile: Hostile, call: dict[str, Any]) -> None:
    audited = len(await hostile.audit())
    over_http = _result(await hostile.post(call))
    after_http = await hostile.audit()
    async with AsyncClient(hostile.target, token=hostile.token()) as client:
        over_grpc = await client.execute(call["tool"], call.get("arguments", {}),
                                         **{k: v for k, v in call.items() if k not in {"tool", "arguments"}})
    after_grpc = await hostile.audit()
    unique = {"meta": _IGNORED, "preview": {"preview_id", "expires_at"}}  # each call's own preview
    assert over_http.model_dump(exclude=unique) == over_grpc.model_dump(exclude=unique)

    def shape(records: list[Any]) -> list[tuple[Any, ...]]:
        return [(r.event.tool, r.event.status, r.event.error_code, r.event.principal_id) for r in records]

    http_events, grpc_events = after_http[audited:], after_grpc[len(after_http):]
    assert http_events and shape(http_events) == shape(grpc_events)


# --- idempotency -------------------------------------------------------------------------------------------------


async def test_a_key_replayed_with_other_arguments_is_refused_as_over_grpc(hostile: Hostile) -> None:
    first = _result(await hostile.post({"tool": "create_note", "arguments": {"text": "one"},
                                        "idempotency_key": "conflict-1"}))
    assert first.status is Status.SUCCESS
    before = tools.CREATED.value
    other = {"tool": "create_note", "arguments": {"text": "two"}, "idempotency_key": "conflict-1"}
    over_http = _result(await hostile.post(other))
    async with AsyncClient(hostile.target, token=hostile.token()) as client:
        over_grpc = await client.execute("create_note", {"text": "two"}, idempotency_key="conflict-1")
    assert over_http.status is Status.ERROR and over_http.error is not None and over_grpc.error is not None
    assert over_http.error.code is over_grpc.error.code
    assert tools.CREATED.value == before


async def test_a_key_is_the_callers_own(hostile: Hostile) -> None:
    call = {"tool": "create_note", "arguments": {"text": "mine"}, "idempotency_key": "own-1"}
    alice = _result(await hostile.post(call))
    bob = _result(await hostile.post(call, token=hostile.token("bob")))
    assert alice.status is bob.status is Status.SUCCESS
    assert bob.meta.idempotency_replayed is False and bob.data != alice.data  # bob's key is not alice's


async def test_64_concurrent_duplicates_of_a_keyed_write_run_it_once(hostile: Hostile) -> None:
    before = tools.CREATED.value
    audited = len(await hostile.audit())
    call = {"tool": "create_note", "arguments": {"text": "dup"}, "idempotency_key": "dup-64"}
    limits = httpx2.Limits(max_connections=MAX_CONNECTIONS)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {hostile.token()}"}, limits=limits,
                                  timeout=30) as http:
        answers = await asyncio.gather(*(http.post(hostile.url, json=call) for _ in range(64)))
    assert tools.CREATED.value == before + 1
    results = [_result(answer) for answer in answers]
    ran = [r for r in results if r.status is Status.SUCCESS]
    assert all(r.data == {"count": before + 1} for r in ran)
    assert all(r.status is Status.SUCCESS or (r.error is not None and r.error.retryable) for r in results)
    assert sum(not r.meta.idempotency_replayed for r in ran) <= 1
    events = [r.event for r in (await hostile.audit())[audited:]]
    assert all(e.idempotency_key == "dup-64" for e in events)
    assert [e.status for e in events].count("dispatching") == 1  # the one run, written before it started
    assert len([e for e in events if e.status != "dispatching"]) == 64  # and one outcome per call


async def test_duplicates_over_both_transports_at_once_run_the_write_once(hostile: Hostile) -> None:
    before = tools.CREATED.value
    call = {"tool": "create_note", "arguments": {"text": "both"}, "idempotency_key": "both-1"}
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {hostile.token()}"}, timeout=30,
                                  limits=httpx2.Limits(max_connections=MAX_CONNECTIONS)) as http, \
            AsyncClient(hostile.target, token=hostile.token()) as client:
        over_http = [http.post(hostile.url, json=call) for _ in range(32)]
        over_grpc = [client.execute("create_note", '{ "text" :  "both" }', idempotency_key="both-1")
                     for _ in range(32)]
        answered, over_grpc_results = await asyncio.gather(asyncio.gather(*over_http), asyncio.gather(*over_grpc))
        results = [_result(a) for a in answered] + list(over_grpc_results)
    assert tools.CREATED.value == before + 1
    assert all(r.status is Status.SUCCESS or (r.error is not None and r.error.code is ErrorCode.OPERATION_IN_PROGRESS)
               for r in results)
    assert all(r.data == {"count": before + 1} for r in results if r.status is Status.SUCCESS)


async def test_a_caller_that_leaves_during_its_write_leaves_it_to_finish_once(hostile: Hostile) -> None:
    tools.HOLD.close()
    started, done = tools.HELD_STARTED.value, tools.HELD_DONE.value
    body = b'{"tool": "held_note", "arguments": {"text": "gone"}, "idempotency_key": "gone-1"}'
    _, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
    writer.write(hostile.head(body))
    await writer.drain()
    await until(lambda: tools.HELD_STARTED.value > started, what="the held write to start")
    writer.close()  # the caller goes away while its write runs
    tools.HOLD.open()
    await hostile.idle()
    again = _result(await hostile.post(json.loads(body)))
    assert again.status is Status.SUCCESS and again.meta.idempotency_replayed
    assert tools.HELD_STARTED.value == started + 1 and tools.HELD_DONE.value == done + 1


async def test_a_write_needing_approval_is_held_over_http_as_over_grpc(hostile: Hostile) -> None:
    note = {"title": "t", "body": "b"}
    over_http = _result(await hostile.post({"tool": "file_note", "arguments": note, "idempotency_key": "ap-1"}))
    async with AsyncClient(hostile.target, token=hostile.token()) as client:
        over_grpc = await client.execute("file_note", note, idempotency_key="ap-2")
    assert over_http.status is over_grpc.status is Status.APPROVAL_REQUIRED
    forged = _result(await hostile.post({"tool": "file_note", "arguments": note, "idempotency_key": "ap-3",
                                         "approval_id": "not-an-approval"}))
    assert forged.status is not Status.SUCCESS


# --- slow and many clients ---------------------------------------------------------------------------------------


async def test_a_client_that_leaves_mid_body_is_no_error_in_the_log(hostile: Hostile,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    head = hostile.head(b"", close=False).replace(b"Content-Length: 0", b"Content-Length: 1000")
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            _, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
            writer.write(head + b'{"tool": "echo", ')
            await writer.drain()
            await until(lambda: bool(hostile.endpoint._server.server_state.tasks), what="the request to start")
            writer.close()
            await hostile.idle()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def test_a_body_slower_than_the_request_timeout_is_cut_off_and_runs_nothing(hostile: Hostile) -> None:
    before = tools.CREATED.value
    body = b'{"tool": "create_note", "arguments": {"text": "slow"}, "idempotency_key": "slow-1"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        writer.write(hostile.head(b"", close=False).replace(b"Content-Length: 0",
                                                              f"Content-Length: {len(body)}".encode()))
        for byte in body[:-1]:  # one byte at a time, until the sidecar closes the connection
            if reader.at_eof():
                break
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:
                break
            try:
                async with asyncio.timeout(0.05):
                    if await reader.read(1) == b"":
                        break
            except TimeoutError:
                pass
            except ConnectionError:  # cut off with a reset: the sidecar closed while bytes were still coming
                break
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(10):
                await reader.read()
    finally:
        writer.close()
    assert loop.time() - started < REQUEST_TIMEOUT + 5
    assert tools.CREATED.value == before


async def test_a_chunked_body_that_never_ends_is_cut_off(hostile: Hostile) -> None:
    head = hostile.head(b"", close=False).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await hostile.raw(head + b"9\r\n{\"tool\": \r\n")
    assert loop.time() - started < REQUEST_TIMEOUT + 5
    await hostile.idle()


async def test_slowloris_holds_the_cap_and_grpc_keeps_answering(hostile: Hostile,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(MAX_CONNECTIONS):
                reader, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
                writer.write(b"POST /v1/call HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
                held.append((reader, writer))
            await until(lambda: len(hostile.endpoint._server.server_state.connections) == MAX_CONNECTIONS,
                        what="the cap to be reached")
            refused = []
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", hostile.port)
                async with asyncio.timeout(5):
                    refused.append(await reader.read())
                writer.close()
            assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in refused)
            async with AsyncClient(hostile.target, token=hostile.token()) as client:
                assert (await client.execute("echo", {"text": "grpc"})).status is Status.SUCCESS
            for reader, _ in held:  # each is closed, 408, once its head is late
                async with asyncio.timeout(HEADER_TIMEOUT + 5):
                    assert (await reader.read()).startswith(b"HTTP/1.1 408 ")
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "refused a connection" in
                    r.getMessage()]
        assert len(warnings) < 20  # rate-limited
    finally:
        for _, writer in held:
            writer.close()
    status, _, _ = _split(await hostile.raw(hostile.head(b'{"tool": "echo", "arguments": {"text": "after"}}')))
    assert status == 200


# --- stopping with calls in flight -------------------------------------------------------------------------------


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


async def test_a_call_outliving_the_grace_gets_a_typed_answer(hostile: Hostile,
                                                              make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(http_json={"listen": "127.0.0.1:0"}, server={"shutdown_grace_seconds": 1})
    endpoint = HttpJsonEndpoint.open(settings, hostile.pipeline)
    await endpoint.start()
    tools.HOLD.close()
    before = tools.HELD_STARTED.value
    loop = asyncio.get_running_loop()
    async with http_client() as http:
        call = asyncio.create_task(http.post(endpoint.url, json={
            "tool": "held_note", "arguments": {"text": "late"}, "idempotency_key": "late-1"}))
        await until(lambda: tools.HELD_STARTED.value > before, what="the held call to start")
        started = loop.time()
        await endpoint.stop()  # the gate is never opened: the call outlives the grace
        assert loop.time() - started < 1 + 3
        try:
            answer = await call
        except httpx2.HTTPError as exc:
            raise AssertionError(f"no answer: {exc!r}") from None
    assert answer.headers["content-type"] == "application/json"
    assert answer.status_code == 503 or _result(answer).status is Status.ERROR


async def _serving(settings: Settings, stop: asyncio.Event, caplog: pytest.LogCaptureFixture) -> tuple[
        asyncio.Task[None], str]:
    """``serve`` of ``settings`` (the test tools and ``held_note``) as a task, and its HTTP/JSON URL once it listens."""
    from sidecar.bootstrap import serve

    def url() -> str | None:
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("HTTP/JSON calls on ")]
        return lines[-1].removeprefix("HTTP/JSON calls on ") if lines else None

    caplog.set_level(logging.INFO, logger="sidecar.server.http_json")
    task = asyncio.create_task(serve(settings, registry=Registry.from_tools([*tools.ALL, tools.held_note]), stop=stop))
    await until(lambda: url() is not None or task.done(), what="the HTTP/JSON endpoint's start-up log")
    if task.done():
        task.result()
    return task, str(url())


async def test_stopping_with_calls_in_flight_answers_them_typed_and_exits_within_the_grace(
        make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture) -> None:
    grace = 1.5
    settings = make_settings(server={"shutdown_grace_seconds": grace}, http_json={"listen": "127.0.0.1:0"})
    stop = asyncio.Event()
    task, url = await _serving(settings, stop, caplog)
    tools.HOLD.close()
    before_started, before_done, before_created = tools.HELD_STARTED.value, tools.HELD_DONE.value, tools.CREATED.value
    loop = asyncio.get_running_loop()
    try:
        async with http_client() as http:
            held = asyncio.create_task(http.post(url, json={"tool": "held_note", "arguments": {"text": "a"},
                                                            "idempotency_key": "stop-held"}))
            quick = [asyncio.create_task(http.post(url, json={"tool": "create_note", "arguments": {"text": "q"},
                                                              "idempotency_key": f"stop-{i}"})) for i in range(8)]
            await until(lambda: tools.HELD_STARTED.value > before_started, what="the held call to start")
            await asyncio.gather(*quick)
            started = loop.time()
            stop.set()  # as SIGTERM does; the held call never finishes on its own
            answer = await held
            async with asyncio.timeout(grace + 5):
                await task
            took = loop.time() - started
    finally:
        stop.set()
        tools.HOLD.close()
    assert took < grace + 2, took
    assert answer.headers["content-type"] == "application/json", answer.text
    result = _result(answer)
    assert result.status is Status.ERROR and result.error is not None  # stopped as at its deadline
    assert tools.HELD_STARTED.value == before_started + 1 and tools.HELD_DONE.value == before_done
    assert tools.CREATED.value == before_created + 8


async def test_results_and_refusals_get_an_access_line(hostile: Hostile, make_settings: Callable[..., Settings],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="toolbooth.access")
    settings = make_settings(http_json={"listen": "127.0.0.1:0"}, logging={"access": True})
    endpoint = HttpJsonEndpoint.open(settings, hostile.pipeline)
    await endpoint.start()
    try:
        async with http_client() as http:
            await http.post(endpoint.url, json={"tool": "echo", "arguments": {"text": "a"}})
            await http.post(endpoint.url, content=b"{}", headers={"Content-Type": "text/plain"})
            await http.post(endpoint.url, json={"tool": "echo", "x": 1})
    finally:
        await endpoint.stop()
    lines = [r for r in caplog.records if r.name == "toolbooth.access"]
    expected = [["POST", "/v1/call", status] for status in ("200", "415", "400")]
    assert [r.getMessage().split()[:3] for r in lines] == expected
    assert all(getattr(r, "http_status", None) and getattr(r, "duration_ms", None) is not None for r in lines)
