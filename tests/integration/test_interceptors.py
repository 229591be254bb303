"""Authentication and the mapping of exceptions to statuses, for every Toolbooth service, on a real server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.client import AsyncClient, ClientError, call_request
from sidecar.config import Settings
from sidecar.contract import (
    ApprovalResult,
    CallBatch,
    CallRequest,
    Operation,
    OperationState,
    Principal,
    Progress,
    ReloadStatus,
    ResultMeta,
    Status,
    ToolListing,
    ToolResult,
)
from sidecar.errors import StoreUnavailableError
from sidecar.pipeline.preview_pages import PreviewPage
from sidecar.server import Sidecar, create_server

pytestmark = pytest.mark.integration


class Fakes:
    """Every gateway the server takes, recording the principal of each call; raises ``error`` if set."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.principals: list[Principal] = []

    def _reached(self, principal: Principal) -> None:
        self.principals.append(principal)
        if self.error is not None:
            raise self.error

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing:
        self._reached(principal)
        return ToolListing(tools=(), policy_revision="rev-1")

    async def execute(self, principal: Principal, request: CallRequest, *,
                      caller_deadline: float | None = None) -> ToolResult:
        self._reached(principal)
        return ToolResult(status=Status.SUCCESS, meta=ResultMeta(request_id="r-1", tool=request.tool))

    async def execute_batch(self, principal: Principal, batch: CallBatch, *,
                            caller_deadline: float | None = None) -> tuple[ToolResult, ...]:
        self._reached(principal)
        return tuple(ToolResult(status=Status.SUCCESS, meta=ResultMeta(request_id="r-1", tool=call.tool))
                     for call in batch.calls)

    async def execute_streamed(self, principal: Principal, request: CallRequest, send: Any, *,
                               caller_deadline: float | None = None) -> ToolResult:
        await send(Progress(progress=1))  # a stream that fails fails after its first event
        self._reached(principal)
        return ToolResult(status=Status.SUCCESS, meta=ResultMeta(request_id="r-1", tool=request.tool))

    async def get_operation(self, principal: Principal, *, tool: str | None = None, key: str | None = None,
                            request_id: str | None = None) -> Operation:
        self._reached(principal)
        return Operation(state=OperationState.NOT_FOUND)

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult:
        self._reached(approver)
        return ApprovalResult(ok=True)

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult:
        self._reached(approver)
        return ApprovalResult(ok=True)

    async def pending(self, principal: Principal, *, all_of_them: bool, limit: int = 100, page_token: str = "",
                      tool: str | None = None, requester: str | None = None) -> PreviewPage:
        self._reached(principal)
        return PreviewPage()

    @property
    def status(self) -> ReloadStatus:
        return ReloadStatus(source="dir", revision="rev-1", loaded_at="2026-01-01T00:00:00Z")


@pytest.fixture
async def serve_fakes() -> Any:
    """``await serve_fakes(settings, fakes)``: a started server whose every service is backed by ``fakes``."""
    started: list[Sidecar] = []

    async def start(settings: Settings, fakes: Fakes) -> str:
        _, sidecar = await create_server(settings, fakes, policy=fakes, approvals=fakes)
        started.append(sidecar)
        await sidecar.start()
        return sidecar.addresses[0]

    yield start
    for sidecar in started:
        await sidecar.stop(None)


# Every Toolbooth method that reaches a gateway, with a request that does.
CALLS: list[tuple[str, Callable[[AsyncClient], Any]]] = [
    ("ListTools", lambda client: client.list_tools()),
    ("ExecuteTool", lambda client: client.execute("echo")),
    ("ExecuteToolBatch", lambda client: client.execute_batch([call_request("echo")])),
    ("ExecuteToolStream", lambda client: _events(client.execute_stream("echo"))),
    ("GetOperation", lambda client: client.get_operation("echo", "k-1")),
    ("ApproveOperation", lambda client: client.approve("p-1", "h-1")),
    ("DenyOperation", lambda client: client.deny("p-1", reason="no")),
    ("ListPreviews", lambda client: client.previews()),
]


async def _events(stream: Any) -> list[Any]:
    return [event async for event in stream]


@pytest.mark.parametrize(("method", "call"), [*CALLS, ("GetPolicyStatus", lambda client: client.policy_status())])
async def test_every_method_refuses_an_unauthenticated_caller_before_its_servicer(
    make_settings, serve_fakes, jwt_auth, make_token, method: str, call: Callable[[AsyncClient], Any]
) -> None:
    fakes = Fakes()
    address = await serve_fakes(make_settings(auth=jwt_auth), fakes)
    async with AsyncClient(address, token=make_token(exp=1), timeout=5) as client:
        with pytest.raises(ClientError) as caught:
            await call(client)
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.UNAUTHENTICATED, "token expired")
    assert fakes.principals == []


@pytest.mark.parametrize(("method", "call"), CALLS)
async def test_every_method_serves_the_authenticated_principal(
    make_settings, serve_fakes, jwt_auth, make_token, method: str, call: Callable[[AsyncClient], Any]
) -> None:
    fakes = Fakes()
    address = await serve_fakes(make_settings(auth=jwt_auth), fakes)
    async with AsyncClient(address, token=make_token(sub="approver-7"), timeout=5) as client:
        await call(client)
    assert [p.id for p in fakes.principals] == ["approver-7"]


@pytest.mark.parametrize(("method", "call"), CALLS)
async def test_a_failed_dependency_is_unavailable_everywhere(
    make_settings, serve_fakes, method: str, call: Callable[[AsyncClient], Any]
) -> None:
    address = await serve_fakes(make_settings(), Fakes(StoreUnavailableError("disk at /secret/path is full")))
    async with AsyncClient(address, timeout=5) as client:
        with pytest.raises(ClientError) as caught:
            await call(client)
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.UNAVAILABLE, "service unavailable")


@pytest.mark.parametrize(("method", "call"), CALLS)
async def test_a_bug_is_internal_everywhere_and_logged_with_its_traceback(
    make_settings, serve_fakes, caplog: pytest.LogCaptureFixture, method: str, call: Callable[[AsyncClient], Any]
) -> None:
    address = await serve_fakes(make_settings(), Fakes(KeyError("password=hunter2")))
    with caplog.at_level(logging.ERROR, logger="sidecar.server"):
        async with AsyncClient(address, timeout=5) as client:
            with pytest.raises(ClientError) as caught:
                await call(client)
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.INTERNAL, "internal error")
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert method in record.getMessage() and record.exc_info is not None
    assert "hunter2" in caplog.text  # in the log, never in the reply


async def test_get_operation_without_a_key_or_request_id_is_an_invalid_argument(make_settings, serve_fakes) -> None:
    fakes = Fakes()
    address = await serve_fakes(make_settings(), fakes)
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.ToolServiceStub(channel).GetOperation(pb.GetOperationRequest(tool="echo"), timeout=5)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "tool and idempotency_key, or request_id, are required")
    assert fakes.principals == []


async def test_health_needs_no_token_in_jwt_mode(make_settings, serve_fakes, jwt_auth) -> None:
    address = await serve_fakes(make_settings(auth=jwt_auth), Fakes())
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert response.status == health_pb2.HealthCheckResponse.SERVING
