"""The thin ``ApprovalService`` servicer: proto in, an ``ApprovalDesk`` call as the caller, proto out.

Who may approve what is the approval policy's decision (``data.toolbooth.approval.approver``),
made in ``sidecar.pipeline.approvals``; refusals are ``ApprovalResult``s, not gRPC errors. A failing
store or policy ends the call with UNAVAILABLE (``sidecar.server.interceptors``), fail closed; a
``page_token`` that no page gave, with INVALID_ARGUMENT.
"""

from __future__ import annotations

from typing import Any

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.server.interceptors import current_principal
from sidecar.server.roles import ApprovalDesk

__all__ = ["SERVICE_NAME", "ApprovalServicer"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ApprovalService"].full_name

_Context = grpc.aio.ServicerContext[Any, Any]


class ApprovalServicer(pb_grpc.ApprovalServiceServicer):
    """Maps ``ApprovalService`` RPCs onto an ``ApprovalDesk``."""

    def __init__(self, desk: ApprovalDesk) -> None:
        self._desk = desk

    async def ApproveOperation(self, request: pb.ApproveOperationRequest, context: _Context) -> pb.ApprovalResult:
        result = await self._desk.approve(current_principal(), request.preview_id, request.preview_hash,
                                          request.comment or None)
        return convert.approval_to_pb(result)

    async def DenyOperation(self, request: pb.DenyOperationRequest, context: _Context) -> pb.ApprovalResult:
        return convert.approval_to_pb(await self._desk.deny(current_principal(), request.preview_id, request.reason))

    async def ListPreviews(self, request: pb.ListPreviewsRequest, context: _Context) -> pb.ListPreviewsResponse:
        page = await self._desk.pending(current_principal(), request.limit, request.page_token)
        return pb.ListPreviewsResponse(previews=[convert.preview_to_pb(p) for p in page.previews],
                                       next_page_token=page.next_page_token)
