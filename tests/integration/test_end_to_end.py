"""The real pipeline behind a real server: clients see typed results; ``serve`` shuts down gracefully."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.bootstrap import open_pipeline, serve
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Recovery, Status
from sidecar.pipeline import Pipeline
from sidecar.plugin import SideEffect, ToolContext, ToolDefinition, tool
from sidecar.server.app import SERVICE_NAME
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.tools import Count

pytestmark = pytest.mark.integration


@pytest.fixture
async def pipeline(make_settings: Callable[..., Settings]) -> AsyncIterator[Pipeline]:
    built = await open_pipeline(make_settings(), registry=Registry.from_tools(tools.ALL))
    yield built
    await built.aclose()


def _gate(started: asyncio.Event, release: asyncio.Event) -> ToolDefinition[Any, Any]:
    """A tool that reports it is running, then waits until the test releases it."""

    @tool(name="gate", version="1.0.0", side_effect=SideEffect.NONE, timeout=10)
    async def gate(args: Count, ctx: ToolContext) -> Count:
        started.set()
        await release.wait()
        return args

    return gate


async def _wait_until_serving(address: str) -> None:
    """Wait for the socket to appear and health to report SERVING."""
    async with grpc.aio.insecure_channel(address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), wait_for_ready=True, timeout=10
        )
        async for response in watch:
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return


async def test_listing_follows_the_availability_policy(make_settings, start_sidecar, pipeline) -> None:
    sidecar = await start_sidecar(make_settings(), pipeline)
    async with AsyncClient(sidecar.addresses[0], timeout=5) as client:
        listing = await client.list_tools()
    names = {descriptor.name for descriptor in listing.tools}
    assert {"echo", "send_email"} <= names and "admin_console" not in names
    assert listing.policy_revision
    echo = next(descriptor for descriptor in listing.tools if descriptor.name == "echo")
    assert echo.input_schema["properties"]["text"]["type"] == "string"


async def test_execute_returns_the_tools_data_as_the_dev_principal(make_settings, start_sidecar, pipeline) -> None:
    sidecar = await start_sidecar(make_settings(), pipeline)
    async with AsyncClient(sidecar.addresses[1], timeout=5) as client:
        result = await client.execute("echo", {"text": "hi"}, call_id="c-1")
    assert result.status is Status.SUCCESS
    assert result.data == {"text": "hi", "principal": "dev", "attempt": 1}
    assert (result.meta.tool, result.meta.tool_version, result.meta.attempt) == ("echo", "1.0.0", 1)


async def test_jwt_subject_is_the_principal_the_tool_sees(
    make_settings, start_sidecar, pipeline, jwt_auth, make_token
) -> None:
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), pipeline)
    async with AsyncClient(sidecar.addresses[0], token=make_token(sub="agent-9"), timeout=5) as client:
        result = await client.execute("echo", {"text": "hi"})
    assert result.data["principal"] == "agent-9"


async def test_invalid_arguments_come_back_as_a_typed_result(make_settings, start_sidecar, pipeline) -> None:
    sidecar = await start_sidecar(make_settings(), pipeline)
    async with AsyncClient(sidecar.addresses[0], timeout=5) as client:
        result = await client.execute("echo", {"text": 42})
    assert result.status is Status.ERROR and result.error is not None
    assert (result.error.code, result.error.recovery, result.error.field) == (
        ErrorCode.INVALID_ARGUMENT, Recovery.CORRECT_ARGUMENTS, "text"
    )
    assert result.errors[0] == result.error


async def test_handler_crash_is_internal_error_without_secrets(make_settings, start_sidecar, pipeline) -> None:
    sidecar = await start_sidecar(make_settings(), pipeline)
    async with AsyncClient(sidecar.addresses[0], timeout=5) as client:
        result = await client.execute("boom", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert "hunter2" not in result.model_dump_json()


async def test_unknown_tool_is_unavailable_not_a_grpc_error(make_settings, start_sidecar, pipeline) -> None:
    sidecar = await start_sidecar(make_settings(), pipeline)
    async with AsyncClient(sidecar.addresses[0], timeout=5) as client:
        result = await client.execute("no_such_tool")
    assert result.error is not None and result.error.code is ErrorCode.TOOL_UNAVAILABLE


async def test_serve_lets_an_in_flight_call_finish_when_stopped(
    make_settings: Callable[..., Settings], socket_path: Path
) -> None:
    started, release, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    settings = make_settings(server={"listen": [f"unix://{socket_path}"], "shutdown_grace_seconds": 10})
    serving = asyncio.create_task(serve(settings, registry=Registry.from_tools([_gate(started, release)]), stop=stop))
    address = f"unix://{socket_path}"
    await _wait_until_serving(address)
    async with AsyncClient(address, timeout=10) as client, grpc.aio.insecure_channel(address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        call = asyncio.create_task(client.execute("gate", {"count": 7}))
        await asyncio.wait_for(started.wait(), 5)
        stop.set()
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        release.set()
        result = await call
        watch.cancel()
    assert (result.status, result.data) == (Status.SUCCESS, {"count": 7})
    await asyncio.wait_for(serving, 10)
    assert not socket_path.exists()


async def test_serve_refuses_new_calls_once_stopped(make_settings: Callable[..., Settings], socket_path: Path) -> None:
    stop = asyncio.Event()
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]})
    serving = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop))
    await _wait_until_serving(f"unix://{socket_path}")
    stop.set()
    await asyncio.wait_for(serving, 10)
    async with AsyncClient(f"unix://{socket_path}", timeout=2) as client:
        with pytest.raises(ClientError) as caught:
            await client.execute("echo", {"text": "hi"})
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
