"""The MCP endpoint's sessions: a few per principal (the least recently used idle one gives way), so that one
principal cannot take them all; idle ones expire and keep little. A real endpoint on 127.0.0.1:0, real HTTP and
MCP clients."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import tracemalloc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from sidecar.config import Settings
from sidecar.server.mcp_http import McpEndpoint
from sidecar.tools.registry import Registry
from tests.conftest import PipelineFactory
from tests.support import tools
from tests.support.mcp import http_client, http_session
from tests.support.waiting import until

pytestmark = pytest.mark.integration

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


@dataclass
class Endpoint:
    url: str
    tokens: Callable[..., str]

    def client(self, sub: str) -> httpx2.AsyncClient:
        return http_client(self.tokens(sub=sub), ACCEPT)


@pytest.fixture
async def endpoint(request: pytest.FixtureRequest, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                   make_token: Callable[..., str], make_pipeline: PipelineFactory) -> AsyncIterator[Endpoint]:
    """The MCP endpoint with at most 2 sessions a principal and 3 in all (or the indirect parameter's)."""
    sessions = {"max_sessions": 3, "max_sessions_per_principal": 2, **getattr(request, "param", {})}
    settings = make_settings(auth=jwt_auth, mcp={"listen": "127.0.0.1:0", **sessions})
    served = McpEndpoint.open(settings, await make_pipeline(registry=Registry.from_tools([tools.held_note])))
    await served.start()
    try:
        yield Endpoint(served.url, make_token)
    finally:
        await served.stop()


async def _open(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """A new session's headers."""
    opened = await http.post(url, json=INIT)
    assert opened.status_code == 200, opened.text
    return {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}


async def _listed(http: httpx2.AsyncClient, url: str, session: dict[str, str]) -> int:
    return (await http.post(url, json=LIST, headers=session)).status_code


async def test_one_principal_cannot_take_every_session_and_others_still_get_in(endpoint: Endpoint) -> None:
    async with endpoint.client("alice") as alice, endpoint.client("bob") as bob:
        opened = [await _open(alice, endpoint.url) for _ in range(12)]  # the cap of all is 3
        answers = [await _listed(alice, endpoint.url, session) for session in opened]
        bobs = await _open(bob, endpoint.url)
        assert await _listed(bob, endpoint.url, bobs) == 200
    assert answers == [404] * 10 + [200, 200]  # her 2 newest are open: each new one ended her oldest idle one


async def test_a_new_session_ends_the_principals_least_recently_used_idle_one(endpoint: Endpoint) -> None:
    async with endpoint.client("alice") as alice:
        first, second = await _open(alice, endpoint.url), await _open(alice, endpoint.url)
        assert await _listed(alice, endpoint.url, first) == 200  # the second is now the least recently used
        third = await _open(alice, endpoint.url)
        answers = [await _listed(alice, endpoint.url, session) for session in (first, second, third)]
    assert answers == [200, 404, 200]


async def test_a_principal_at_their_most_gets_a_new_session_even_when_every_session_is_taken(
        endpoint: Endpoint) -> None:
    async with endpoint.client("alice") as alice, endpoint.client("bob") as bob:
        first, second = await _open(alice, endpoint.url), await _open(alice, endpoint.url)
        bobs = await _open(bob, endpoint.url)  # 3: the cap of all
        third = await _open(alice, endpoint.url)
        answers = [await _listed(alice, endpoint.url, session) for session in (first, second, third)]
        assert await _listed(bob, endpoint.url, bobs) == 200
        refused = await bob.post(endpoint.url, json=INIT)
    assert answers == [404, 200, 200]
    assert refused.status_code == 503  # the cap of all holds for a principal below their most


async def test_a_refused_opening_request_ends_none_of_the_principals_sessions(endpoint: Endpoint) -> None:
    """Only an accepted new session ends an old one: a request without a session id that opens none (a body
    that is no JSON-RPC message, an initialize too large, any other request, a GET or a DELETE) leaves the
    principal's idle sessions alone, even when they hold their most."""
    opening = [{"content": b"{not json"}, {"content": _initialize(2**17)}, {"json": LIST}]
    async with endpoint.client("alice") as alice:
        held = [await _open(alice, endpoint.url), await _open(alice, endpoint.url)]  # her most: 2
        refused, answers = [], []
        for request in [alice.post(endpoint.url, **body) for body in opening] + [alice.get(endpoint.url),
                                                                                 alice.delete(endpoint.url)]:
            refused.append((await request).status_code)
            answers.append([await _listed(alice, endpoint.url, session) for session in held])
    assert refused[:2] == [400, 413] and all(status >= 400 for status in refused), refused
    assert answers == [[200, 200]] * 5


async def test_a_principal_whose_sessions_are_all_busy_is_refused_429_and_nobody_else_is(endpoint: Endpoint) -> None:
    tools.HOLD.close()
    started = tools.HELD_STARTED.value
    async with endpoint.client("alice") as alice, endpoint.client("bob") as bob:
        sessions = [await _open(alice, endpoint.url) for _ in range(2)]
        calls = [asyncio.create_task(alice.post(endpoint.url, headers=session, json={
            "jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "held_note", "arguments": {"text": "x"},
                       "_meta": {"toolbooth/idempotency_key": f"busy-{n}"}}})) for n, session in enumerate(sessions)]
        try:
            await tools.HELD_STARTED.reached(started + 2)
            refused = await alice.post(endpoint.url, json=INIT)
            with pytest.raises(ExceptionGroup) as raised:  # what an agent on the SDK's client sees
                async with http_session(endpoint.url, endpoint.tokens(sub="alice")):
                    pass
            assert await _listed(bob, endpoint.url, await _open(bob, endpoint.url)) == 200
        finally:
            tools.HOLD.open()
        answered = await asyncio.gather(*calls)
    assert (refused.status_code, refused.headers["content-type"]) == (429, "application/json")
    error = refused.json()
    assert (error["id"], error["error"]["code"]) == (None, -32603) and "mcp-session-id" not in refused.headers
    assert "Too many open sessions for this principal" in error["error"]["message"]
    assert raised.group_contains(MCPError, match="^Too many open sessions for this principal", depth=2)
    assert [call.status_code for call in answered] == [200, 200]  # the busy sessions were left alone


@pytest.mark.parametrize("endpoint", [{"session_idle_seconds": 0.3}], indirect=True)
async def test_a_session_without_a_request_for_session_idle_seconds_ends(endpoint: Endpoint,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp.server.streamable_http_manager")
    async with endpoint.client("alice") as alice:
        session = await _open(alice, endpoint.url)
        assert await _listed(alice, endpoint.url, session) == 200
        # asking whether it ended would be a request, which keeps it: wait for the SDK to say it ended it
        await until(lambda: f"Session {session['mcp-session-id']} idle timeout" in caplog.text,
                    what="the idle session's end")
        assert await _listed(alice, endpoint.url, session) == 404


async def test_an_idle_session_keeps_nothing_of_the_last_request_it_read(endpoint: Endpoint) -> None:
    """The session's dispatcher kept the last message it read (here 2 MB of params) until it read another."""
    padded = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"_meta": {"pad": "x" * 2**21}}})
    async with endpoint.client("alice") as alice:
        session = await _open(alice, endpoint.url)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            assert (await alice.post(endpoint.url, content=padded, headers=session)).json()["result"] == {}
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert kept < 2**18, f"{kept} bytes kept"


def _initialize(pad: int) -> str:
    """An initialize request whose client announces ``pad`` bytes of experimental capabilities."""
    params = {**INIT["params"], "capabilities": {"experimental": {"pad": {"x": "x" * pad}}}}  # type: ignore[dict-item]
    return json.dumps({**INIT, "id": 7, "params": params})


async def test_an_initialize_above_max_initialize_bytes_is_refused_and_keeps_nothing(endpoint: Endpoint) -> None:
    """A session keeps its initialize params for its life: a 1 MB initialize was 1 MB kept a session."""
    large = _initialize(2**20).encode()  # the client keeps the body it sent with its answer
    async with endpoint.client("alice") as alice:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            refused = await alice.post(endpoint.url, content=large)
            await until(lambda: gc.collect() >= 0 and tracemalloc.get_traced_memory()[0] - before < 2**18,
                        what="the refused initialize's memory released")
        finally:
            tracemalloc.stop()
        normal = await alice.post(endpoint.url, content=_initialize(48 * 1024))  # below the default 64 KiB
        assert normal.status_code == 200, normal.text
        session = {"mcp-session-id": normal.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        assert await _listed(alice, endpoint.url, session) == 200
    assert (refused.status_code, refused.headers["content-type"]) == (413, "application/json")
    assert "mcp-session-id" not in refused.headers
    error = refused.json()
    assert (error["id"], error["error"]["code"]) == (7, -32600)
    assert "mcp.max_initialize_bytes" in error["error"]["message"]
