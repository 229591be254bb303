"""Slow and many HTTP clients cannot exhaust the sidecar (``sidecar.server.http_limits``, ``http_guard``).

Against a real ``toolbooth serve`` process with MCP, the approval inbox and metrics on: hundreds of raw connections
that send part of a header and stop are closed by the server within the header timeout (408); those past a
listener's cap are answered 503 and closed at once, while the connections it already serves keep working;
gRPC, MCP, the inbox and metrics answer meanwhile and afterwards; the log stays a few lines. A token of
``auth.max_token_bytes`` is read whole by both listeners (only the authenticator refuses a larger one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
from prometheus_client import CollectorRegistry

from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.server.http_json import HttpJsonEndpoint
from sidecar.server.mcp_http import McpEndpoint
from sidecar.server.metrics_http import MetricsEndpoint
from tests.integration.test_server import FakeGateway
from tests.support.inbox import Browser, free_port, served_inbox
from tests.support.mcp import http_client
from tests.support.sidecar_process import SidecarProcess
from tests.support.waiting import until

pytestmark = pytest.mark.integration

HEADER_TIMEOUT = 1.5
CAP = 120  # connections each listener holds
PAST_CAP = 25  # connections opened to each listener once it holds CAP
SLACK = 15.0  # how much later than its bound a loaded machine may see a connection closed
PARTIAL = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MAX_LOG_LINES = 30
RESET = b"reset"
REFUSED = (b"HTTP/1.1 503 Service Unavailable", RESET)  # a 503, unless the reset came first


@dataclass
class Slow:
    """A raw connection that sent part of a request head and nothing more."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    opened: float

    @classmethod
    async def open(cls, port: int) -> Slow:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PARTIAL)
        await writer.drain()
        return cls(reader, writer, time.monotonic())

    async def answer(self) -> tuple[bytes, float]:
        """What the server wrote before it closed the connection (``RESET`` when it reset it: closed with the
        partial head unread), and how long after it was opened."""
        try:
            async with asyncio.timeout(HEADER_TIMEOUT + SLACK):
                written = await self.reader.read()
        except ConnectionResetError:
            written = RESET
        except TimeoutError:
            raise AssertionError(f"a slow connection still open {HEADER_TIMEOUT + SLACK} s after it opened") from None
        finally:
            self.writer.close()
        return written, time.monotonic() - self.opened


async def _slow(port: int, count: int) -> list[Slow]:
    return list(await asyncio.gather(*(Slow.open(port) for _ in range(count))))


def _kinds(answers: list[tuple[bytes, float]]) -> dict[str, int]:
    """How many connections were closed after a 408 (``timed out``), refused (a 503 or a reset), or otherwise."""
    kinds: dict[str, int] = {}
    for written, _ in answers:
        status = written.partition(b"\r\n")[0]
        kind = "timed out" if status == b"HTTP/1.1 408 Request Timeout" else "refused" if status in REFUSED else status
        kinds[str(kind)] = kinds.get(str(kind), 0) + 1
    return kinds


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[tuple[SidecarProcess, int, int, int]]:
    """A serving sidecar (dev mode) with MCP, the inbox and metrics on, each within the test's bounds: it and
    their ports."""
    mcp_port, inbox_port, metrics_port = free_port(), free_port(), free_port()
    connections = {"header_timeout_seconds": HEADER_TIMEOUT, "idle_timeout_seconds": 30, "max_connections": CAP}
    bounds = connections | {"request_timeout_seconds": 2 * HEADER_TIMEOUT}
    config = tmp_path / "toolbooth.json"
    config.write_text(json.dumps({"server": {"listen": [f"unix://{tmp_path / 's.sock'}"]},
                                  "store": {"sqlite_path": str(tmp_path / "s.db")}, "log_level": "INFO",
                                  "mcp": {"listen": f"127.0.0.1:{mcp_port}", "http": bounds},
                                  "approvals_ui": {"listen": f"127.0.0.1:{inbox_port}", "http": bounds},
                                  "metrics": {"listen": f"127.0.0.1:{metrics_port}", "http": connections}}))
    process = SidecarProcess(config, tmp_path / "s.sock", tmp_path / "s.err", tmp_path / "appended.log")
    try:
        await process.wait_serving()
        yield process, mcp_port, inbox_port, metrics_port
    finally:
        assert process.stop() == 0, process.output()


async def test_slow_clients_are_closed_and_excess_ones_refused_while_everything_answers(
        sidecar: tuple[SidecarProcess, int, int, int]) -> None:
    process, mcp_port, inbox_port, metrics_port = sidecar
    mcp_url, inbox_url = f"http://127.0.0.1:{mcp_port}/mcp", f"http://127.0.0.1:{inbox_port}"
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    async with httpx2.AsyncClient(headers=ACCEPT, timeout=30, limits=httpx2.Limits(max_connections=1)) as served, \
            httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=1)) as scraper, \
            AsyncClient(process.target, timeout=10) as grpc_client:
        browser = Browser(inbox_url)
        try:
            # One connection each listener serves before the flood (counted in its cap), kept alive through it.
            assert (await served.post(mcp_url, json=INIT)).status_code == 200
            assert (await browser.get("/sign-in")).status == 200
            assert (await scraper.get(metrics_url)).status_code == 200
            slow = {port: await _slow(port, CAP - 1 + PAST_CAP) for port in (mcp_port, inbox_port, metrics_port)}

            async def meanwhile() -> None:
                await grpc_client.list_tools()
                assert (await served.post(mcp_url, json=INIT)).status_code == 200
                assert (await browser.get("/sign-in")).status == 200
                assert (await scraper.get(metrics_url)).status_code == 200

            answers = {port: asyncio.gather(*(one.answer() for one in slow[port])) for port in slow}
            await meanwhile()
            closed = {port: await answers[port] for port in answers}
        finally:
            await browser.close()
        await grpc_client.list_tools()
    # Every connection is free again: new ones are served.
    async with http_client(None, ACCEPT) as fresh:
        assert (await fresh.post(mcp_url, json=INIT)).status_code == 200
    fresh_browser = Browser(inbox_url)
    try:
        assert (await fresh_browser.get("/sign-in")).status == 200
    finally:
        await fresh_browser.close()
    async with httpx2.AsyncClient(timeout=30) as fresh_scraper:
        assert (await fresh_scraper.get(metrics_url)).status_code == 200

    expected = {"timed out": CAP - 1, "refused": PAST_CAP}
    assert {port: _kinds(closed[port]) for port in closed} == {mcp_port: expected, inbox_port: expected,
                                                               metrics_port: expected}
    assert max(after for port in closed for _, after in closed[port]) < HEADER_TIMEOUT + SLACK
    log = process.output().splitlines()
    assert len([line for line in log if "refused a connection" in line]) <= 5, "\n".join(log)
    assert len(log) <= MAX_LOG_LINES, "\n".join(log)

async def test_a_token_of_the_largest_size_gets_through_mcp_and_the_inbox(
        tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
        make_token: Callable[..., str]) -> None:
    token = _token_of(16 * 1024, make_token)
    settings = make_settings(auth=jwt_auth, mcp={"listen": "127.0.0.1:0"}, approvals_ui={"listen": "127.0.0.1:0"})
    endpoint = McpEndpoint.open(settings, FakeGateway())
    await endpoint.start()
    try:
        # The head arrives in two parts, as over a slow network: the first, all but its end, is read alone.
        answer = await _in_two_parts(endpoint.url, *_initialize(endpoint.url, token), _another(endpoint.url, 401))
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        async with http_client(_token_of(16 * 1024 + 200, make_token), ACCEPT) as http:
            refused = await http.post(endpoint.url, json=INIT)
        assert refused.status_code == 401, refused.text  # the authenticator's refusal, not the head's size
    finally:
        await endpoint.stop()
    async with served_inbox(settings, make_token, tmp_path) as world:
        browser = world.browser()
        page = await browser.sign_in(_token_of(16 * 1024, make_token, roles=["approver"]))
        assert (page.status, page.location) == (303, "/inbox"), page.text


async def test_a_head_past_the_limit_is_refused_not_buffered(make_settings: Callable[..., Settings]) -> None:
    endpoint = McpEndpoint.open(make_settings(mcp={"listen": "127.0.0.1:0"}), FakeGateway())
    await endpoint.start()
    try:
        head, body = _initialize(endpoint.url, "")
        padded = head + b"X-Pad: " + b"x" * (16 * 1024 + 8192) + b"\r\n"  # the largest token's and 8 KiB besides
        answer = await _in_two_parts(endpoint.url, padded, body, _another(endpoint.url, 200))
        assert answer.startswith(b"HTTP/1.1 400 ") or answer == RESET, answer
    finally:
        await endpoint.stop()


async def test_metrics_serve_a_kept_alive_connection_and_time_out_only_a_late_head(
        make_settings: Callable[..., Settings]) -> None:
    timeout = 0.5
    settings = make_settings(metrics={"listen": "127.0.0.1:0",
                                      "http": {"header_timeout_seconds": timeout, "idle_timeout_seconds": 30}})
    endpoint = MetricsEndpoint(CollectorRegistry(), settings.metrics)
    await endpoint.start()
    parts = urlsplit(endpoint.url)
    head = f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        for piece in (head[:-2], head[-2:]):  # the blank line that ends the head may come in a read of its own
            writer.write(piece)
            await writer.drain()
        assert await _response(reader) == b"HTTP/1.1 200 OK\r\n"
        await asyncio.sleep(1.5 * timeout)  # past the first head's deadline: it was cancelled when the head arrived
        writer.write(head)
        assert await _response(reader) == b"HTTP/1.1 200 OK\r\n"
        writer.write(head[:-2])  # a late head on a served connection is closed without an answer
        async with asyncio.timeout(SLACK):
            assert await reader.read() == b""
    finally:
        writer.close()
        await endpoint.stop()


async def test_a_late_first_head_on_metrics_is_answered_408_even_past_the_idle_timeout(
        make_settings: Callable[..., Settings]) -> None:
    # aiohttp's keep-alive timer runs from the connection too: the head is due at the sooner of the two bounds.
    settings = make_settings(metrics={"listen": "127.0.0.1:0",
                                      "http": {"header_timeout_seconds": 30, "idle_timeout_seconds": 1}})
    endpoint = MetricsEndpoint(CollectorRegistry(), settings.metrics)
    await endpoint.start()
    try:
        parts = urlsplit(endpoint.url)
        assert parts.port is not None
        written, after = await (await Slow.open(parts.port)).answer()
        assert written.partition(b"\r\n")[0] == b"HTTP/1.1 408 Request Timeout", written
        assert after < 1 + SLACK
    finally:
        await endpoint.stop()


BOUNDS = {"header_timeout_seconds": 0.5, "request_timeout_seconds": 1.0, "idle_timeout_seconds": 30}


async def test_a_body_slower_than_the_request_timeout_is_closed(make_settings: Callable[..., Settings]) -> None:
    endpoint = McpEndpoint.open(make_settings(mcp={"listen": "127.0.0.1:0", "http": BOUNDS}), FakeGateway())
    await endpoint.start()
    parts = urlsplit(endpoint.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        body = json.dumps(INIT).encode()
        head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: {ACCEPT['Accept']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        began = time.monotonic()
        writer.write(head + body[:10])  # the whole head, within its timeout, and the body's first bytes only
        async with asyncio.timeout(BOUNDS["request_timeout_seconds"] + SLACK):
            assert await reader.read() == b""  # a request arrived: closed without an answer
        assert time.monotonic() - began >= BOUNDS["request_timeout_seconds"]  # not at the head's timeout
    finally:
        writer.close()
        await endpoint.stop()


@pytest.mark.parametrize("listener", ["mcp", "approvals_ui", "http_json"])
async def test_a_late_second_head_on_a_kept_alive_connection_is_answered_408(
        listener: str, tmp_path: Path, make_settings: Callable[..., Settings],
        make_token: Callable[..., str]) -> None:
    settings = make_settings(**{listener: {"listen": "127.0.0.1:0", "http": BOUNDS}})
    async with _serving(listener, settings, make_token, tmp_path) as url:
        parts = urlsplit(url)
        head = f"GET /missing HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            writer.write(head)
            assert (await _response(reader)).startswith(b"HTTP/1.1 404 ")
            began = time.monotonic()
            writer.write(head[:-2])  # the next head, but for its blank line
            async with asyncio.timeout(BOUNDS["header_timeout_seconds"] + SLACK):
                answer = await reader.read()
            assert answer.partition(b"\r\n")[0] == b"HTTP/1.1 408 Request Timeout", answer
            assert time.monotonic() - began >= BOUNDS["header_timeout_seconds"]  # from its first byte
        finally:
            writer.close()


@asynccontextmanager
async def _serving(listener: str, settings: Settings, make_token: Callable[..., str],
                   root: Path) -> AsyncIterator[str]:
    """The URL of ``listener`` (``mcp``, ``approvals_ui`` or ``http_json``) served within ``settings``."""
    if listener == "approvals_ui":
        async with served_inbox(settings, make_token, root) as world:
            yield world.inbox.url
        return
    opened = HttpJsonEndpoint if listener == "http_json" else McpEndpoint
    endpoint = opened.open(settings, FakeGateway())
    await endpoint.start()
    try:
        yield endpoint.url
    finally:
        await endpoint.stop()


async def _response(reader: asyncio.StreamReader) -> bytes:
    """The status line of the next response on ``reader``, read through to the end of its body."""
    async with asyncio.timeout(SLACK):
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            length = int(value) if name.lower() == b"content-length" else length
        await reader.readexactly(length)
    return status


def _another(url: str, status: int) -> Callable[[], Awaitable[None]]:
    """A request answered ``status``: once it is, the server has read what was sent to it before."""
    async def answered() -> None:
        async with http_client(None, ACCEPT) as other:
            assert (await other.post(url, json=INIT)).status_code == status
    return answered


def _initialize(url: str, token: str) -> tuple[bytes, bytes]:
    """The head (but for its last line break) and the body of an MCP ``initialize`` with ``token``."""
    parts, body = urlsplit(url), json.dumps(INIT).encode()
    head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
            f"Accept: {ACCEPT['Accept']}\r\nContent-Type: application/json\r\n"
            f"traceparent: 00-{'a' * 32}-{'b' * 16}-01\r\nContent-Length: {len(body)}\r\n")
    return head.encode(), body


async def _in_two_parts(url: str, head: bytes, body: bytes, between: Callable[[], Awaitable[None]]) -> bytes:
    """The status line answering ``head`` (all but its last line break), sent before ``between()``, then its
    end and ``body``; ``RESET`` if the server reset the connection."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(head)
        await writer.drain()
        await between()
        writer.write(b"\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(SLACK):
            return await reader.readline()
    except ConnectionResetError:
        return RESET
    finally:
        writer.close()


def _token_of(size: int, make_token: Callable[..., str], **claims: Any) -> str:
    """A validly signed token of about ``size`` bytes (never more)."""
    pad = 0
    while len(token := make_token(pad="x" * pad, **claims)) < size - 4:
        pad += max(1, (size - len(token)) * 3 // 4)
    while len(token) > size:
        pad -= 1
        token = make_token(pad="x" * pad, **claims)
    return token


_PATHS = {"mcp": "/mcp/", "approvals_ui": "/inbox/", "http_json": "/v1/call/"}


@pytest.mark.parametrize("listener", ["mcp", "approvals_ui", "http_json"])
async def test_a_trailing_slash_is_not_found_never_redirected(
        listener: str, tmp_path: Path, make_settings: Callable[..., Settings],
        make_token: Callable[..., str]) -> None:
    settings = make_settings(**{listener: {"listen": "127.0.0.1:0"}})
    async with _serving(listener, settings, make_token, tmp_path) as url:
        parts = urlsplit(url)
        head = (f"POST {_PATHS[listener]} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                "Content-Length: 2\r\nConnection: close\r\n\r\n{}").encode()
        answer = await _raw(parts, head)
    assert answer.startswith(b"HTTP/1.1 404 "), answer
    assert b"\r\nlocation:" not in answer.lower()


@pytest.mark.parametrize("listener", ["mcp", "approvals_ui", "http_json"])
@pytest.mark.parametrize("bad", [b"Content-Length: 3\r\nContent-Length: 4\r\n", b"Content-Length: -1\r\n"])
async def test_a_request_http_cannot_read_is_answered_in_the_listeners_own_form(
        listener: str, bad: bytes, tmp_path: Path, make_settings: Callable[..., Settings],
        make_token: Callable[..., str]) -> None:
    settings = make_settings(**{listener: {"listen": "127.0.0.1:0"}})
    async with _serving(listener, settings, make_token, tmp_path) as url:
        parts = urlsplit(url)
        answer = await _raw(parts, f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode() + bad
                            + b"\r\n{}")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    if listener == "approvals_ui":  # the inbox serves pages: uvicorn's plain text
        assert b"content-type: text/plain" in head.lower()
    else:
        assert b"content-type: application/json" in head.lower()
        assert json.loads(body)["error"]["code"] == "INVALID_REQUEST"


@pytest.mark.parametrize("listener", ["mcp", "approvals_ui", "http_json"])
async def test_a_client_that_leaves_mid_body_is_no_error_in_the_log(
        listener: str, tmp_path: Path, make_settings: Callable[..., Settings], make_token: Callable[..., str],
        caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings(**{listener: {"listen": "127.0.0.1:0", "http": BOUNDS}})
    path = {"approvals_ui": "/sign-in"}.get(listener)
    kind = "application/x-www-form-urlencoded" if listener == "approvals_ui" else "application/json"
    def left() -> int:  # the listener's note that a client left before its request arrived
        return sum("a client left before its" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.DEBUG):
        async with _serving(listener, settings, make_token, tmp_path) as url:
            parts = urlsplit(url)
            for seen, cut in enumerate((False, True), start=1):  # the client closes, or the request deadline cuts it
                reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
                writer.write((f"POST {path or parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                              f"Accept: {ACCEPT['Accept']}\r\nContent-Type: {kind}\r\n"
                              "Content-Length: 1000\r\n\r\n{\"a\": ").encode())
                await writer.drain()
                if cut:
                    async with asyncio.timeout(BOUNDS["request_timeout_seconds"] + SLACK):
                        await reader.read()
                writer.close()
                await until(lambda seen=seen: left() == seen, timeout=SLACK, what="the listener to see the client gone")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


async def _raw(parts: Any, request: bytes) -> bytes:
    """What the server answers ``request`` (read until it closes the connection)."""
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        async with asyncio.timeout(SLACK):
            return await reader.read()
    finally:
        writer.close()
