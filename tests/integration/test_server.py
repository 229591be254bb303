"""Transport-level behaviour of a real server on real sockets, with a fake gateway behind it."""

from __future__ import annotations

import asyncio
import logging
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.client import AsyncClient, Client, ClientError
from sidecar.config import Settings
from sidecar.contract import CallRequest, Principal, ResultMeta, Status, ToolListing, ToolResult
from sidecar.errors import ConfigError, PolicyEvaluationError
from sidecar.server import create_server
from sidecar.server.app import SERVICE_NAME

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class FakeGateway:
    """Records what reaches it and answers with ``data`` (or raises ``error``)."""

    def __init__(self, *, data: Any = None, error: Exception | None = None) -> None:
        self.data, self.error = data, error
        self.calls: list[tuple[Principal, CallRequest | str | None, float | None]] = []

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing:
        self.calls.append((principal, conversation_id, None))
        if self.error is not None:
            raise self.error
        return ToolListing(tools=(), policy_revision="rev-1")

    async def execute(self, principal: Principal, request: CallRequest, *,
                      caller_deadline: float | None = None) -> ToolResult:
        self.calls.append((principal, request, caller_deadline))
        if self.error is not None:
            raise self.error
        return ToolResult(status=Status.SUCCESS, data=self.data, meta=ResultMeta(request_id="r-1", tool=request.tool))


async def _health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return (await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)).status


async def _reflect(address: str, request: reflection_pb2.ServerReflectionRequest) -> Any:
    async with grpc.aio.insecure_channel(address) as channel:
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]), timeout=5)
        async for response in stream:
            return response


async def _execute_status(address: str, request: pb.ExecuteToolRequest, token: str | None = None) -> Any:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.ToolServiceStub(channel).ExecuteTool(request, metadata=metadata, timeout=5)
    return caught.value


async def test_health_is_not_serving_until_started(make_settings: Callable[..., Settings]) -> None:
    _, sidecar = await create_server(make_settings(), FakeGateway())
    try:
        for service in ("", SERVICE_NAME):
            response = await sidecar.health.Check(health_pb2.HealthCheckRequest(service=service), None)
            assert response.status == NOT_SERVING
    finally:
        await sidecar.stop(None)


async def test_health_is_serving_on_every_address_after_start(make_settings, start_sidecar) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway())
    assert sidecar.addresses[0].startswith("unix:///") and sidecar.addresses[1].startswith("127.0.0.1:")
    assert not sidecar.addresses[1].endswith(":0")
    for address in sidecar.addresses:
        assert [await _health(address, service) for service in ("", SERVICE_NAME)] == [SERVING, SERVING]


async def test_health_watch_sees_not_serving_when_shutdown_begins(make_settings, start_sidecar) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway())
    async with grpc.aio.insecure_channel(sidecar.addresses[0]) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert (await watch.read()).status == SERVING
        stopping = asyncio.create_task(sidecar.stop(0.5))
        assert (await watch.read()).status == NOT_SERVING
        await stopping


async def test_reflection_lists_the_tool_service_in_dev_mode(make_settings, start_sidecar) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway())
    listing = await _reflect(sidecar.addresses[0], reflection_pb2.ServerReflectionRequest(list_services=""))
    assert SERVICE_NAME in [service.name for service in listing.list_services_response.service]
    symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME)
    assert (await _reflect(sidecar.addresses[0], symbol)).file_descriptor_response.file_descriptor_proto


async def test_reflection_is_off_by_default_in_jwt_mode(make_settings, start_sidecar, jwt_auth) -> None:
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), FakeGateway())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _reflect(sidecar.addresses[0], reflection_pb2.ServerReflectionRequest(list_services=""))
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_reflection_can_be_turned_on_in_jwt_mode(make_settings, start_sidecar, jwt_auth) -> None:
    sidecar = await start_sidecar(make_settings(auth=jwt_auth, server={"reflection": True}), FakeGateway())
    response = await _reflect(sidecar.addresses[0], reflection_pb2.ServerReflectionRequest(list_services=""))
    assert SERVICE_NAME in [service.name for service in response.list_services_response.service]


async def test_socket_is_0660_in_a_0750_directory_and_removed_on_stop(
    make_settings, start_sidecar, socket_path: Path
) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway())
    assert stat.S_ISSOCK(socket_path.stat().st_mode)
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660
    assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o750
    await sidecar.stop(None)
    assert not socket_path.exists()


async def test_a_stale_socket_file_is_replaced(make_settings, start_sidecar, socket_path: Path) -> None:
    socket_path.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(socket_path))
    sidecar = await start_sidecar(make_settings(), FakeGateway())
    assert await _health(sidecar.addresses[0]) == SERVING


async def test_a_live_socket_is_never_taken_over(make_settings, socket_path: Path) -> None:
    socket_path.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(socket_path))
        live.listen()
        with pytest.raises(OSError, match="another process is listening"):
            await create_server(make_settings(), FakeGateway())
        assert stat.S_ISSOCK(socket_path.stat().st_mode)


async def test_a_regular_file_at_the_socket_path_is_left_alone(make_settings, socket_path: Path) -> None:
    socket_path.parent.mkdir()
    socket_path.write_text("precious")
    with pytest.raises(FileExistsError, match="not a socket"):
        await create_server(make_settings(), FakeGateway())
    assert socket_path.read_text() == "precious"


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0", "192.0.2.10:0", "example.com:0"])
def test_dev_mode_refuses_non_loopback_tcp_before_anything_starts(make_settings, address: str) -> None:
    with pytest.raises(ConfigError, match=r"server\.listen: .* is not a loopback address"):
        make_settings(server={"listen": [address]})


async def test_dev_mode_allows_localhost_and_warns_at_start(
    make_settings, start_sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sidecar.server.app"):
        sidecar = await start_sidecar(make_settings(server={"listen": ["localhost:0"]}), FakeGateway())
    assert await _health(sidecar.addresses[0]) == SERVING
    assert "auth mode 'dev'" in caplog.text


async def test_jwt_mode_may_listen_on_every_interface(make_settings, start_sidecar, jwt_auth) -> None:
    sidecar = await start_sidecar(make_settings(auth=jwt_auth, server={"listen": ["0.0.0.0:0"]}), FakeGateway())
    port = sidecar.addresses[0].rpartition(":")[2]
    assert await _health(f"127.0.0.1:{port}") == SERVING


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"exp": 1}, "token expired"),
        ({"aud": "another-service"}, "invalid token audience"),
        ({"iss": "https://evil.example"}, "invalid token issuer"),
        ({"exp": None}, "token is missing the exp claim"),
        ({"exp": "9999999999"}, "invalid token claim exp"),  # RFC 7519: a NumericDate is a JSON number
        ({"nbf": "0"}, "invalid token claim nbf"),
        ({"iat": True}, "invalid token claim iat"),
        ({"exp": False}, "invalid token claim exp"),  # read as 0, it was "token expired"
        ({"exp": "0"}, "invalid token claim exp"),
        ({"nbf": "99999999999"}, "invalid token claim nbf"),  # read as a number, it was "token not yet valid"
    ],
)
async def test_jwt_mode_refuses_bad_tokens_before_the_gateway(
    make_settings, start_sidecar, jwt_auth, make_token, claims: dict[str, Any], message: str
) -> None:
    gateway = FakeGateway()
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), gateway)
    token = make_token(**claims)
    error = await _execute_status(sidecar.addresses[0], pb.ExecuteToolRequest(tool="echo"), token)
    assert (error.code(), error.details()) == (grpc.StatusCode.UNAUTHENTICATED, message)
    async with AsyncClient(sidecar.addresses[1], token=token) as client:
        with pytest.raises(ClientError) as caught:
            await client.list_tools()
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.UNAUTHENTICATED, message)
    assert gateway.calls == []


@pytest.mark.parametrize("token", [None, "not-a-jwt", "forged.token.value"])
async def test_jwt_mode_refuses_missing_or_garbage_tokens(
    make_settings, start_sidecar, jwt_auth, token: str | None
) -> None:
    gateway = FakeGateway()
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), gateway)
    async with AsyncClient(sidecar.addresses[0], token=token) as client:
        with pytest.raises(ClientError) as caught:
            await client.execute("echo", {"text": "hi"})
    assert caught.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert gateway.calls == []


async def test_jwt_principal_and_call_reach_the_gateway(make_settings, start_sidecar, jwt_auth, make_token) -> None:
    gateway = FakeGateway(data={"ok": True})
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), gateway)
    async with AsyncClient(sidecar.addresses[0], token=make_token(sub="agent-9")) as client:
        result = await client.execute("echo", {"text": "hi"}, idempotency_key="k-1", call_id="c-1")
    principal, request, deadline = gateway.calls[0]
    assert principal == Principal(id="agent-9", tenant="acme", roles=("developer",))
    assert request == CallRequest(tool="echo", arguments_json='{"text":"hi"}', idempotency_key="k-1", call_id="c-1")
    assert deadline is None
    assert (result.status, result.data) == (Status.SUCCESS, {"ok": True})


async def test_caller_deadline_becomes_a_monotonic_deadline(make_settings, start_sidecar) -> None:
    gateway = FakeGateway()
    sidecar = await start_sidecar(make_settings(), gateway)
    async with AsyncClient(sidecar.addresses[0], timeout=5) as client:
        before = time.monotonic()
        await client.execute("echo")
    deadline = gateway.calls[0][2]
    # gRPC converts the deadline between clocks, so allow it to be a few milliseconds late.
    assert deadline is not None and before + 4 < deadline < time.monotonic() + 5.5


async def test_empty_tool_is_an_invalid_argument(make_settings, start_sidecar) -> None:
    gateway = FakeGateway()
    sidecar = await start_sidecar(make_settings(), gateway)
    error = await _execute_status(sidecar.addresses[0], pb.ExecuteToolRequest(arguments_json="{}"))
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "tool is required")
    assert gateway.calls == []


async def test_gateway_bugs_never_leak_their_text(make_settings, start_sidecar) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway(error=RuntimeError("password=hunter2")))
    async with AsyncClient(sidecar.addresses[0]) as client:
        with pytest.raises(ClientError) as caught:
            await client.execute("echo")
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.INTERNAL, "internal error")


async def test_unavailable_dependencies_are_unavailable(make_settings, start_sidecar) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway(error=PolicyEvaluationError("policy down")))
    async with AsyncClient(sidecar.addresses[0]) as client:
        with pytest.raises(ClientError) as caught:
            await client.list_tools()
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.UNAVAILABLE, "service unavailable")


async def test_request_above_the_message_limit_is_refused(make_settings, start_sidecar) -> None:
    gateway = FakeGateway()
    sidecar = await start_sidecar(make_settings(limits={"max_message_bytes": 4096}), gateway)
    async with AsyncClient(sidecar.addresses[0]) as client:
        with pytest.raises(ClientError) as caught:
            await client.execute("echo", {"text": "x" * 8192})
        assert (await client.execute("echo", {"text": "x" * 1024})).status is Status.SUCCESS
    assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(gateway.calls) == 1


async def test_response_above_the_message_limit_is_refused(make_settings, start_sidecar) -> None:
    sidecar = await start_sidecar(make_settings(limits={"max_message_bytes": 4096}), FakeGateway(data="x" * 8192))
    async with AsyncClient(sidecar.addresses[0]) as client:
        with pytest.raises(ClientError) as caught:
            await client.execute("echo")
    assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_sync_client_over_unix_socket(make_settings, start_sidecar) -> None:
    gateway = FakeGateway(data=[1, 2])
    sidecar = await start_sidecar(make_settings(), gateway)

    def call() -> tuple[ToolListing, ToolResult]:
        with Client(sidecar.addresses[0], timeout=5) as client:
            return client.list_tools(conversation_id="conv-1"), client.execute("echo", '{"text":"hi"}')

    listing, result = await asyncio.to_thread(call)
    assert listing == ToolListing(tools=(), policy_revision="rev-1")
    assert result.data == [1, 2]
    assert gateway.calls[0][1] == "conv-1"


async def test_clients_raise_client_error_when_nothing_listens(tmp_path: Path) -> None:
    address = f"unix://{tmp_path / 'nobody.sock'}"
    async with AsyncClient(address, timeout=2) as client:
        with pytest.raises(ClientError) as caught:
            await client.list_tools()
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
    with Client(address, timeout=2) as sync_client, pytest.raises(ClientError) as caught:
        sync_client.execute("echo")
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE


async def test_a_failed_bind_releases_what_was_already_bound(make_settings, socket_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(OSError, match=f"cannot listen on {taken}: the port is in use"):
            await create_server(make_settings(server={"listen": [f"unix://{socket_path}", taken]}), FakeGateway())
    assert not socket_path.exists()
