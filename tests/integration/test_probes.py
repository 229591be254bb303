"""The health-only listener (``server.health_listen``): ``grpc.health.v1`` for probes, and nothing else.

It answers what the main listeners' health says (NOT_SERVING before start and from the start of a
shutdown), refuses the Toolbooth services and reflection, and may listen beyond loopback in dev mode.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.config import Settings
from sidecar.server import create_server
from sidecar.server.app import SERVICE_NAME
from tests.integration.conftest import ServeInBackground, StartSidecar
from tests.integration.test_server import NOT_SERVING, SERVING, FakeGateway
from tests.support.waiting import until

pytestmark = pytest.mark.integration


async def _check(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        return (await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                                 timeout=5)).status


async def _refused(address: str, call: Callable[[grpc.aio.Channel], object]) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(channel)  # type: ignore[misc]
    return caught.value.code()


async def test_the_probe_port_answers_health_and_refuses_everything_else(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar) -> None:
    sidecar = await start_sidecar(make_settings(server={"health_listen": "127.0.0.1:0"}), FakeGateway())
    (probe,) = sidecar.probe_addresses
    assert probe not in sidecar.addresses
    assert [await _check(probe, service) for service in ("", SERVICE_NAME)] == [SERVING, SERVING]

    def execute(channel: grpc.aio.Channel) -> object:
        return pb_grpc.ToolServiceStub(channel).ExecuteTool(pb.ExecuteToolRequest(tool="echo"), timeout=5)

    def list_tools(channel: grpc.aio.Channel) -> object:
        return pb_grpc.ToolServiceStub(channel).ListTools(pb.ListToolsRequest(), timeout=5)

    async def reflect(channel: grpc.aio.Channel) -> object:
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]), timeout=5)
        return [response async for response in stream]

    assert await _refused(probe, execute) is grpc.StatusCode.UNIMPLEMENTED
    assert await _refused(probe, list_tools) is grpc.StatusCode.UNIMPLEMENTED
    assert await _refused(probe, reflect) is grpc.StatusCode.UNIMPLEMENTED
    assert await _check(sidecar.addresses[0]) == SERVING  # the main listeners keep their services


async def test_the_probe_port_says_not_serving_before_start_and_during_shutdown(
        make_settings: Callable[..., Settings]) -> None:
    _, sidecar = await create_server(make_settings(server={"health_listen": "127.0.0.1:0"}), FakeGateway())
    assert sidecar.probes is not None
    await sidecar.probes.start()  # as if the main server were still starting
    (probe,) = sidecar.probe_addresses
    assert await _check(probe) == NOT_SERVING
    await sidecar.start()
    assert await _check(probe) == SERVING
    async with grpc.aio.insecure_channel(probe) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert (await watch.read()).status == SERVING
        await sidecar.stop(None)
        assert (await watch.read()).status == NOT_SERVING


def test_the_probe_port_may_listen_on_every_interface_in_dev_mode(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(server={"health_listen": "0.0.0.0:8081"})
    assert settings.auth.effective_mode.value == "dev" and settings.server.health_listen == "0.0.0.0:8081"


async def test_a_probe_port_in_use_releases_the_main_listeners(make_settings: Callable[..., Settings],
                                                               socket_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: the port is in use"):
            await create_server(make_settings(server={"health_listen": f"127.0.0.1:{port}"}), FakeGateway())
    assert not socket_path.exists()


async def test_serve_logs_the_probe_port(serve_in_background: ServeInBackground,
                                         caplog: pytest.LogCaptureFixture) -> None:
    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("health only")]

    with caplog.at_level(logging.INFO, logger="sidecar.server.app"):
        await serve_in_background(server={"health_listen": "127.0.0.1:0"})
        await until(logged, what="the start-up log of the probe port")
    assert await _check(logged()[0].removeprefix("health only (for probes) on ")) == SERVING
