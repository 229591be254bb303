"""``auth.max_token_bytes``: the largest bearer token accepted, on every listener, every time; a larger one is
refused every time: UNAUTHENTICATED, or, when the call's metadata exceeds gRPC's limit (the token's limit plus
``sidecar.config.auth.OTHER_METADATA_BYTES``, soft and hard alike), RESOURCE_EXHAUSTED naming that limit.

A real sidecar on a real socket, through the real client; and its MCP endpoint through a real HTTP client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.server.mcp_http import McpEndpoint
from tests.integration.conftest import StartSidecar
from tests.integration.test_server import FakeGateway
from tests.support.mcp import http_client

pytestmark = pytest.mark.integration

DEFAULT_MAX = 16 * 1024
METADATA_LIMIT = DEFAULT_MAX + 8192  # the token's and OTHER_METADATA_BYTES for the rest
TIMES = 40  # calls of each kind: gRPC used to refuse metadata between its soft and hard limits at random
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

Tokens = Callable[..., str]


def _token_of(size: int, make_token: Tokens) -> str:
    """A validly signed token of ``size`` bytes, or ``size - 1`` (base64 skips some lengths)."""
    pad = 0
    while len(token := make_token(pad="x" * pad)) < size - 1:
        pad += max(1, (size - 1 - len(token)) * 3 // 4)
    while len(token) > size:
        pad -= 1
        token = make_token(pad="x" * pad)
    assert size - 1 <= len(token) <= size
    return token


def _too_large(limit: int) -> str:
    return f"token too large: at most {limit} bytes (auth.max_token_bytes)"


async def _outcomes(target: str, token: str, times: int = TIMES) -> set[tuple[grpc.StatusCode, str]]:
    """What ``times`` calls with ``token`` ended with (``OK`` when answered)."""
    outcomes = set()
    async with AsyncClient(target, token=token, timeout=10) as client:
        for _ in range(times):
            try:
                await client.list_tools()
                outcomes.add((grpc.StatusCode.OK, ""))
            except ClientError as exc:
                outcomes.add((exc.code, exc.details))
    return outcomes


@pytest.fixture
async def target(make_settings: Callable[..., Settings], start_sidecar: StartSidecar,
                 jwt_auth: dict[str, Any]) -> AsyncIterator[str]:
    """A sidecar verifying tokens with the default ``auth.max_token_bytes``: its TCP address."""
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), FakeGateway())
    yield sidecar.addresses[-1]


@pytest.mark.parametrize("size", [6 * 1024, 12 * 1024, DEFAULT_MAX])
async def test_a_token_up_to_the_limit_is_accepted_every_time(target: str, make_token: Tokens, size: int) -> None:
    assert await _outcomes(target, _token_of(size, make_token)) == {(grpc.StatusCode.OK, "")}


async def test_a_larger_token_is_refused_as_unauthenticated_every_time(target: str, make_token: Tokens) -> None:
    outcomes = await _outcomes(target, _token_of(DEFAULT_MAX + 2, make_token))
    assert outcomes == {(grpc.StatusCode.UNAUTHENTICATED, _too_large(DEFAULT_MAX))}


async def test_metadata_beyond_grpcs_limit_is_refused_naming_the_limit_every_time(target: str) -> None:
    # Beyond the hard limit gRPC never drew lots (and answers each refusal slowly): fewer calls show it.
    outcomes = await _outcomes(target, "x" * 2 * METADATA_LIMIT, times=5)
    assert {code for code, _ in outcomes} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all("exceeds hard limit (value length" in details and f"vs. {METADATA_LIMIT})"
               in details for _, details in outcomes), outcomes


async def test_a_configured_limit_is_the_one_applied(make_settings: Callable[..., Settings],
                                                     start_sidecar: StartSidecar, jwt_auth: dict[str, Any],
                                                     make_token: Tokens) -> None:
    sidecar = await start_sidecar(make_settings(auth={**jwt_auth, "max_token_bytes": 4096}), FakeGateway())
    assert await _outcomes(sidecar.addresses[-1], _token_of(4096, make_token)) == {(grpc.StatusCode.OK, "")}
    outcomes = await _outcomes(sidecar.addresses[-1], _token_of(4098, make_token))
    assert outcomes == {(grpc.StatusCode.UNAUTHENTICATED, _too_large(4096))}


async def test_the_mcp_endpoint_accepts_and_refuses_the_same_tokens(make_settings: Callable[..., Settings],
                                                                    jwt_auth: dict[str, Any],
                                                                    make_token: Tokens) -> None:
    endpoint = McpEndpoint.open(make_settings(auth=jwt_auth, mcp={"listen": "127.0.0.1:0"}), FakeGateway())
    await endpoint.start()
    try:
        async with http_client(_token_of(DEFAULT_MAX, make_token), ACCEPT) as http:
            assert (await http.post(endpoint.url, json=INIT)).status_code == 200
        async with http_client(_token_of(DEFAULT_MAX + 2, make_token), ACCEPT) as http:
            refused = await http.post(endpoint.url, json=INIT)
        assert (refused.status_code, refused.json()["error_description"]) == (401, _too_large(DEFAULT_MAX))
    finally:
        await endpoint.stop()
