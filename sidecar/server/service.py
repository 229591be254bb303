"""The thin ``ToolService`` servicer: authenticate, convert, call the gateway, convert back.

Every decision lives behind ``ToolGateway`` (the pipeline). The only gRPC errors
produced here are UNAUTHENTICATED, INVALID_ARGUMENT for a request without a tool,
UNAVAILABLE when a dependency failed, and INTERNAL (without the exception text)
for a bug; everything else is a ``ToolResult``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.contract import CallRequest, Operation, Principal, ToolListing, ToolResult
from sidecar.errors import AuthenticationError, DependencyError
from sidecar.server.auth import Authenticator

log = logging.getLogger(__name__)

T = TypeVar("T")


class ToolGateway(Protocol):
    """What the servicer needs from the pipeline."""

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing: ...

    async def execute(
        self, principal: Principal, request: CallRequest, *, caller_deadline: float | None = None
    ) -> ToolResult: ...

    async def get_operation(self, principal: Principal, *, tool: str | None = None, key: str | None = None,
                            request_id: str | None = None) -> Operation: ...


class ToolServicer(pb_grpc.ToolServiceServicer):
    """Maps ``ToolService`` RPCs onto a ``ToolGateway``."""

    def __init__(self, gateway: ToolGateway, authenticator: Authenticator) -> None:
        self._gateway = gateway
        self._authenticator = authenticator

    async def ListTools(
        self, request: pb.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListToolsResponse:
        principal = await self._authenticate(context)
        listing = self._gateway.list_tools(principal, conversation_id=request.conversation_id or None)
        return convert.listing_to_pb(await _guarded(listing, context))

    async def ExecuteTool(self, request: pb.ExecuteToolRequest, context: grpc.aio.ServicerContext) -> pb.ToolResult:
        principal = await self._authenticate(context)
        if not request.tool:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tool is required")
        call = convert.call_request_from_pb(request)
        result = self._gateway.execute(principal, call, caller_deadline=_caller_deadline(context))
        return convert.result_to_pb(await _guarded(result, context))

    async def GetOperation(self, request: pb.GetOperationRequest, context: grpc.aio.ServicerContext) -> pb.Operation:
        principal = await self._authenticate(context)
        if request.request_id:
            found = self._gateway.get_operation(principal, request_id=request.request_id)
        elif request.tool and request.idempotency_key:
            found = self._gateway.get_operation(principal, tool=request.tool, key=request.idempotency_key)
        else:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tool and idempotency_key, or request_id, "
                                "are required")
        return convert.operation_to_pb(await _guarded(found, context))

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        return await authenticate(self._authenticator, context)


async def authenticate(authenticator: Authenticator, context: grpc.aio.ServicerContext) -> Principal:
    """The caller's principal, or the RPC ends with UNAUTHENTICATED and nothing else runs."""
    try:
        return authenticator.authenticate(context.invocation_metadata() or ())
    except AuthenticationError as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))


def _caller_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's gRPC deadline as an absolute ``time.monotonic()`` value."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


async def _guarded(call: Awaitable[T], context: grpc.aio.ServicerContext) -> T:
    """Await a gateway call; never let an exception's text reach the caller."""
    try:
        return await call
    except DependencyError:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "service unavailable")
    except Exception:
        log.exception("unexpected error while serving a call")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error")
