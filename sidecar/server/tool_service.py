"""The thin ``ToolService`` servicer: proto in, a ``ToolGateway`` (the pipeline) call, proto out.

Every decision lives behind the gateway (``sidecar.server.gateway``, re-exported here); authentication and the
mapping of exceptions to gRPC statuses live in ``sidecar.server.interceptors``. The only errors raised here are
``InvalidRequestError`` for a request without its required fields (the gateway raises it too, for a
malformed string field of ``ListTools`` and ``GetOperation``, and for an empty or too large batch);
everything else is a result. ``ExecuteToolStream`` writes its events with ``context.write`` (a coroutine,
not a generator), so the interceptors wrap it as they wrap a unary method.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.contract import Progress
from sidecar.errors import InvalidRequestError
from sidecar.server.gateway import TOOL_REQUIRED, ToolGateway
from sidecar.server.interceptors import current_principal

__all__ = ["OPERATION_KEY_REQUIRED", "SERVICE_NAME", "TOOL_REQUIRED", "ToolGateway", "ToolServicer"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ToolService"].full_name
OPERATION_KEY_REQUIRED = "tool and idempotency_key, or request_id, are required"

_Context = grpc.aio.ServicerContext[Any, Any]


class ToolServicer(pb_grpc.ToolServiceServicer):
    """Maps ``ToolService`` RPCs onto a ``ToolGateway``."""

    def __init__(self, gateway: ToolGateway) -> None:
        self._gateway = gateway

    async def ListTools(self, request: pb.ListToolsRequest, context: _Context) -> pb.ListToolsResponse:
        listing = await self._gateway.list_tools(current_principal(), conversation_id=request.conversation_id or None)
        return convert.listing_to_pb(listing)

    async def ExecuteTool(self, request: pb.ExecuteToolRequest, context: _Context) -> pb.ToolResult:
        if not request.tool:
            raise InvalidRequestError(TOOL_REQUIRED)
        call = convert.call_request_from_pb(request)
        result = await self._gateway.execute(current_principal(), call, caller_deadline=_caller_deadline(context))
        return convert.result_to_pb(result)

    async def ExecuteToolBatch(self, request: pb.ExecuteToolBatchRequest,
                               context: _Context) -> pb.ExecuteToolBatchResponse:
        for index, call in enumerate(request.calls):
            if not call.tool:
                raise InvalidRequestError(f"calls[{index}]: {TOOL_REQUIRED}")
        results = await self._gateway.execute_batch(current_principal(), convert.batch_from_pb(request),
                                                    caller_deadline=_caller_deadline(context))
        return convert.batch_results_to_pb(results)

    async def ExecuteToolStream(self, request: pb.ExecuteToolRequest, context: _Context) -> None:  # type: ignore[override]
        if not request.tool:
            raise InvalidRequestError(TOOL_REQUIRED)

        async def send(update: Progress) -> None:
            await context.write(convert.event_to_pb(update))

        result = await self._gateway.execute_streamed(current_principal(), convert.call_request_from_pb(request), send,
                                                      caller_deadline=_caller_deadline(context))
        await context.write(convert.event_to_pb(result))

    async def GetOperation(self, request: pb.GetOperationRequest, context: _Context) -> pb.Operation:
        if not (request.request_id or (request.tool and request.idempotency_key)):
            raise InvalidRequestError(OPERATION_KEY_REQUIRED)
        found = await self._gateway.get_operation(current_principal(), tool=request.tool or None,
                                                  key=request.idempotency_key or None,
                                                  request_id=request.request_id or None)
        return convert.operation_to_pb(found)


def _caller_deadline(context: _Context) -> float | None:
    """The caller's gRPC deadline as an absolute ``time.monotonic()`` value."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining
