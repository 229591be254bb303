"""The thin ``ApprovalService`` servicer: authenticate the approver, call ``Approvals``, convert back.

Who may approve what is the approval policy's decision (``data.toolbooth.approval.approver``),
made in ``sidecar.pipeline.approvals``; refusals are ``ApprovalResult``s, not gRPC errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.contract import ApprovalResult, Preview, Principal
from sidecar.errors import PolicyEvaluationError, StoreUnavailableError
from sidecar.server.auth import Authenticator
from sidecar.server.service import authenticate

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ApprovalService"].full_name
DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 100, 1000
T = TypeVar("T")


class ApprovalGateway(Protocol):
    """What the servicer needs: ``sidecar.pipeline.approvals.Approvals``."""

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult: ...

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult: ...

    async def pending(self, principal: Principal, *, all_of_them: bool, limit: int = 100) -> list[Preview]: ...


class ApprovalServicer(pb_grpc.ApprovalServiceServicer):
    """Maps ``ApprovalService`` RPCs onto an ``ApprovalGateway``; operators list every pending preview."""

    def __init__(self, approvals: ApprovalGateway, authenticator: Authenticator,
                 is_operator: Callable[[Principal], bool]) -> None:
        self._approvals, self._authenticator, self._is_operator = approvals, authenticator, is_operator

    async def ApproveOperation(self, request: pb.ApproveOperationRequest,
                               context: grpc.aio.ServicerContext) -> pb.ApprovalResult:
        approver = await authenticate(self._authenticator, context)
        result = self._approvals.approve(approver, request.preview_id, request.preview_hash, request.comment or None)
        return convert.approval_to_pb(await result)

    async def DenyOperation(self, request: pb.DenyOperationRequest,
                            context: grpc.aio.ServicerContext) -> pb.ApprovalResult:
        approver = await authenticate(self._authenticator, context)
        return convert.approval_to_pb(await self._approvals.deny(approver, request.preview_id, request.reason))

    async def ListPreviews(self, request: pb.ListPreviewsRequest,
                           context: grpc.aio.ServicerContext) -> pb.ListPreviewsResponse:
        principal = await authenticate(self._authenticator, context)
        pending = self._approvals.pending(principal, all_of_them=self._is_operator(principal),
                                         limit=min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT))
        previews = await _unavailable_as_status(pending, context)
        return pb.ListPreviewsResponse(previews=[convert.preview_to_pb(p) for p in previews])


async def _unavailable_as_status(call: Awaitable[T], context: grpc.aio.ServicerContext) -> T:
    """A failing store or policy ends the RPC with UNAVAILABLE (fail closed, no details)."""
    try:
        return await call
    except (StoreUnavailableError, PolicyEvaluationError):
        await context.abort(grpc.StatusCode.UNAVAILABLE, "service unavailable")
