"""The thin ``ApprovalService`` servicer: proto in, an ``ApprovalGateway`` call as the caller, proto out.

Who may approve what is the approval policy's decision (``data.toolbooth.approval.approver``),
made in ``sidecar.pipeline.approvals``; refusals are ``ApprovalResult``s, not gRPC errors. A failing
store or policy ends the call with UNAVAILABLE (``sidecar.server.interceptors``), fail closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.contract import ApprovalResult, Preview, Principal
from sidecar.server.interceptors import current_principal

__all__ = ["DEFAULT_LIST_LIMIT", "MAX_LIST_LIMIT", "SERVICE_NAME", "ApprovalGateway", "ApprovalServicer"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ApprovalService"].full_name
DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 100, 1000

Context = grpc.aio.ServicerContext[Any, Any]


class ApprovalGateway(Protocol):
    """What the servicer needs: ``sidecar.pipeline.approvals.Approvals``."""

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult: ...

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult: ...

    async def pending(self, principal: Principal, *, all_of_them: bool, limit: int = 100) -> list[Preview]: ...


class ApprovalServicer(pb_grpc.ApprovalServiceServicer):
    """Maps ``ApprovalService`` RPCs onto an ``ApprovalGateway``; operators list every pending preview."""

    def __init__(self, approvals: ApprovalGateway, is_operator: Callable[[Principal], bool]) -> None:
        self._approvals, self._is_operator = approvals, is_operator

    async def ApproveOperation(self, request: pb.ApproveOperationRequest, context: Context) -> pb.ApprovalResult:
        result = await self._approvals.approve(current_principal(), request.preview_id, request.preview_hash,
                                               request.comment or None)
        return convert.approval_to_pb(result)

    async def DenyOperation(self, request: pb.DenyOperationRequest, context: Context) -> pb.ApprovalResult:
        return convert.approval_to_pb(await self._approvals.deny(current_principal(), request.preview_id,
                                                                 request.reason))

    async def ListPreviews(self, request: pb.ListPreviewsRequest, context: Context) -> pb.ListPreviewsResponse:
        principal = current_principal()
        previews = await self._approvals.pending(principal, all_of_them=self._is_operator(principal),
                                                 limit=min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT))
        return pb.ListPreviewsResponse(previews=[convert.preview_to_pb(p) for p in previews])
