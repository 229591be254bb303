"""Domain types ↔ ``toolbooth.v1`` protobuf messages, in both directions.

Enum values are paired by name (``ErrorCode.TIMEOUT`` ↔ ``ERROR_CODE_TIMEOUT``), never
by a hand-written table, so a member missing on either side fails at import time.
Optional strings travel as ``""`` on the wire and are ``None`` in the domain.
"""

from __future__ import annotations

import json
import operator
from enum import Enum
from typing import Any, Generic, TypeVar

from cachetools import LRUCache

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.contract import (
    ApprovalResult,
    CallBatch,
    CallRequest,
    ErrorCode,
    ErrorInfo,
    Operation,
    OperationState,
    Preview,
    PreviewState,
    Progress,
    Recovery,
    ReloadStatus,
    Requester,
    ResultMeta,
    SideEffect,
    Status,
    ToolDescriptor,
    ToolEvent,
    ToolListing,
    ToolResult,
)

__all__ = [
    "ERROR_CODE",
    "OPERATION_STATE",
    "PREVIEW_STATE",
    "RECOVERY",
    "SIDE_EFFECT",
    "STATUS",
    "EnumMap",
    "approval_from_pb",
    "approval_to_pb",
    "batch_from_pb",
    "batch_results_from_pb",
    "batch_results_to_pb",
    "batch_to_pb",
    "call_request_from_pb",
    "call_request_to_pb",
    "descriptor_from_pb",
    "descriptor_to_pb",
    "error_from_pb",
    "error_to_pb",
    "event_from_pb",
    "event_to_pb",
    "listing_from_pb",
    "listing_to_pb",
    "meta_from_pb",
    "meta_to_pb",
    "operation_from_pb",
    "operation_to_pb",
    "preview_from_pb",
    "preview_to_pb",
    "progress_from_pb",
    "progress_to_pb",
    "result_from_pb",
    "result_to_pb",
    "status_from_pb",
    "status_to_pb",
]

E = TypeVar("E", bound=Enum)
P = TypeVar("P", bound=int)

_OPTIONAL_CALL_FIELDS = ("idempotency_key", "approval_id", "conversation_id", "call_id")


class EnumMap(Generic[E, P]):
    """Pairs a domain enum with a proto enum: ``Member.NAME`` ↔ ``PREFIX_NAME``."""

    def __init__(self, domain: type[E], proto: type[P]) -> None:
        wrapper: Any = proto  # an EnumTypeWrapper at runtime; the stubs type it as the enum class
        prefix = wrapper.Name(0).removesuffix("UNSPECIFIED")
        self._to_pb: dict[E, P] = {member: wrapper.Value(prefix + member.name) for member in domain}
        self._from_pb: dict[int, E] = {number: member for member, number in self._to_pb.items()}
        self._name: str = wrapper.DESCRIPTOR.name

    def to_pb(self, member: E) -> P:
        """The proto value of ``member``."""
        return self._to_pb[member]

    def from_pb(self, number: int) -> E:
        """The domain member for ``number``; ``ValueError`` for UNSPECIFIED or unknown values."""
        try:
            return self._from_pb[number]
        except KeyError:
            raise ValueError(f"unknown {self._name} value {number}") from None


STATUS = EnumMap(Status, pb.Status)
ERROR_CODE = EnumMap(ErrorCode, pb.ErrorCode)
RECOVERY = EnumMap(Recovery, pb.Recovery)
SIDE_EFFECT = EnumMap(SideEffect, pb.SideEffect)
PREVIEW_STATE = EnumMap(PreviewState, pb.PreviewState)
OPERATION_STATE = EnumMap(OperationState, pb.OperationState)
_OPTIONAL_PREVIEW_FIELDS = ("decided_by", "decided_at", "comment", "rendering_json", "created_at", "tool")


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode  # made once, not per call


def error_to_pb(error: ErrorInfo) -> pb.ToolError:
    """One domain error as a proto ``ToolError``."""
    return pb.ToolError(
        code=ERROR_CODE.to_pb(error.code),
        message=error.message,
        retryable=error.retryable,
        recovery=RECOVERY.to_pb(error.recovery),
        field=error.field or "",
        details_json="" if error.details is None else _dumps(error.details),
    )


def error_from_pb(message: pb.ToolError) -> ErrorInfo:
    """A proto ``ToolError`` as a domain error."""
    return ErrorInfo(
        code=ERROR_CODE.from_pb(message.code),
        message=message.message,
        retryable=message.retryable,
        recovery=RECOVERY.from_pb(message.recovery),
        field=message.field or None,
        details=json.loads(message.details_json) if message.details_json else None,
    )


def meta_to_pb(meta: ResultMeta) -> pb.ResultMeta:
    """Result facts as a proto ``ResultMeta`` (same field names on both sides; no ``next_cursor`` is ``""``)."""
    return pb.ResultMeta(request_id=meta.request_id, tool=meta.tool, tool_version=meta.tool_version,
                         duration_ms=meta.duration_ms, attempt=meta.attempt,
                         idempotency_replayed=meta.idempotency_replayed, truncated=meta.truncated,
                         policy_revision=meta.policy_revision, next_cursor=meta.next_cursor or "",
                         has_more=meta.has_more)


def meta_from_pb(message: pb.ResultMeta) -> ResultMeta:
    """A proto ``ResultMeta`` as domain result facts."""
    fields = {field.name: getattr(message, field.name) for field in message.DESCRIPTOR.fields}
    return ResultMeta(**{**fields, "next_cursor": message.next_cursor or None})


def result_to_pb(result: ToolResult) -> pb.ToolResult:
    """A domain result as a proto ``ToolResult``; ``data`` becomes compact JSON."""
    return pb.ToolResult(
        status=STATUS.to_pb(result.status),
        data_json="" if result.data is None else _dumps(result.data),
        error=None if result.error is None else error_to_pb(result.error),
        errors=[error_to_pb(error) for error in result.errors],
        meta=meta_to_pb(result.meta),
        preview=None if result.preview is None else preview_to_pb(result.preview),
    )


def result_from_pb(message: pb.ToolResult) -> ToolResult:
    """A proto ``ToolResult`` as a domain result."""
    return ToolResult(
        status=STATUS.from_pb(message.status),
        data=json.loads(message.data_json) if message.data_json else None,
        error=error_from_pb(message.error) if message.HasField("error") else None,
        errors=tuple(error_from_pb(error) for error in message.errors),
        meta=meta_from_pb(message.meta),
        preview=preview_from_pb(message.preview) if message.HasField("preview") else None,
    )


def operation_to_pb(operation: Operation) -> pb.Operation:
    result = None if operation.result is None else result_to_pb(operation.result)
    return pb.Operation(state=OPERATION_STATE.to_pb(operation.state), result=result)


def operation_from_pb(message: pb.Operation) -> Operation:
    result = result_from_pb(message.result) if message.HasField("result") else None
    return Operation(state=OPERATION_STATE.from_pb(message.state), result=result)


def preview_to_pb(preview: Preview) -> pb.Preview:
    """A preview as proto; ``None`` becomes ``""``."""
    fields = preview.model_dump(exclude={"state", "requested_by"})
    fields.update({name: fields[name] or "" for name in _OPTIONAL_PREVIEW_FIELDS})
    by = preview.requested_by
    return pb.Preview(**fields, state=PREVIEW_STATE.to_pb(preview.state),
                      requested_by=None if by is None else pb.Requester(id=by.id, tenant=by.tenant))


def preview_from_pb(message: pb.Preview) -> Preview:
    """A proto preview as a domain preview; empty optional fields become ``None``."""
    return Preview(
        preview_id=message.preview_id, preview_hash=message.preview_hash, call_json=message.call_json,
        reason=message.reason, expires_at=message.expires_at, state=PREVIEW_STATE.from_pb(message.state),
        approver_roles=tuple(message.approver_roles),
        requested_by=Requester(id=message.requested_by.id, tenant=message.requested_by.tenant)
        if message.HasField("requested_by") else None,
        **{name: getattr(message, name) or None for name in _OPTIONAL_PREVIEW_FIELDS},
    )


def approval_to_pb(result: ApprovalResult) -> pb.ApprovalResult:
    """An approval outcome as proto."""
    return pb.ApprovalResult(ok=result.ok, error=None if result.error is None else error_to_pb(result.error),
                             preview=None if result.preview is None else preview_to_pb(result.preview))


def approval_from_pb(message: pb.ApprovalResult) -> ApprovalResult:
    """A proto approval outcome as a domain one."""
    return ApprovalResult(ok=message.ok, error=error_from_pb(message.error) if message.HasField("error") else None,
                          preview=preview_from_pb(message.preview) if message.HasField("preview") else None)


# The proto of each descriptor converted lately, by the descriptor object's id: a registry's descriptors are
# built once and listed again and again, and their schemas' JSON is most of a listing's cost. The entry holds
# its descriptor, so that id cannot be reused while it is cached; descriptors are frozen.
_PB_DESCRIPTORS: LRUCache[int, tuple[ToolDescriptor, pb.ToolDescriptor]] = LRUCache(maxsize=4096)


def descriptor_to_pb(descriptor: ToolDescriptor) -> pb.ToolDescriptor:
    """A tool descriptor as proto; the schemas become compact JSON (an empty output schema: ``""``).

    The same descriptor object gives the same (cached) message: treat it as read-only."""
    cached = _PB_DESCRIPTORS.get(id(descriptor))
    if cached is not None and cached[0] is descriptor:
        return cached[1]
    message = _descriptor_message(descriptor)
    _PB_DESCRIPTORS[id(descriptor)] = (descriptor, message)
    return message


def _descriptor_message(descriptor: ToolDescriptor) -> pb.ToolDescriptor:
    return pb.ToolDescriptor(
        name=descriptor.name,
        version=descriptor.version,
        description=descriptor.description,
        input_schema_json=_dumps(descriptor.input_schema),
        side_effect=SIDE_EFFECT.to_pb(descriptor.side_effect),
        requires_idempotency_key=descriptor.requires_idempotency_key,
        timeout_ms=descriptor.timeout_ms,
        output_schema_json=_dumps(descriptor.output_schema) if descriptor.output_schema else "",
        title=descriptor.title,
    )


def descriptor_from_pb(message: pb.ToolDescriptor) -> ToolDescriptor:
    """A proto tool descriptor as a domain descriptor."""
    return ToolDescriptor(
        name=message.name,
        version=message.version,
        description=message.description,
        input_schema=json.loads(message.input_schema_json) if message.input_schema_json else {},
        side_effect=SIDE_EFFECT.from_pb(message.side_effect),
        requires_idempotency_key=message.requires_idempotency_key,
        timeout_ms=message.timeout_ms,
        output_schema=json.loads(message.output_schema_json) if message.output_schema_json else {},
        title=message.title,
    )


# The responses of listings made lately, by policy revision and the ids of the descriptors shown: the callers
# a policy shows the same tools get the same response, built once (the availability decisions that chose the
# tools are still made for each caller). Each entry holds its descriptors, so their ids cannot be reused while
# it is cached.
_PB_LISTINGS: LRUCache[tuple[str, tuple[int, ...]], tuple[tuple[ToolDescriptor, ...], pb.ListToolsResponse]] = (
    LRUCache(maxsize=256))


def listing_to_pb(listing: ToolListing) -> pb.ListToolsResponse:
    """A tool listing as a ``ListToolsResponse``.

    The same descriptors under the same revision give the same (cached) message: treat it as read-only."""
    key = (listing.policy_revision, tuple(map(id, listing.tools)))
    cached = _PB_LISTINGS.get(key)
    if cached is not None and all(map(operator.is_, cached[0], listing.tools)):
        return cached[1]
    message = pb.ListToolsResponse(tools=[descriptor_to_pb(tool) for tool in listing.tools],
                                   policy_revision=listing.policy_revision)
    _PB_LISTINGS[key] = (listing.tools, message)
    return message


def listing_from_pb(message: pb.ListToolsResponse) -> ToolListing:
    """A ``ListToolsResponse`` as a domain tool listing."""
    return ToolListing(
        tools=tuple(descriptor_from_pb(tool) for tool in message.tools),
        policy_revision=message.policy_revision,
    )


def call_request_to_pb(request: CallRequest) -> pb.ExecuteToolRequest:
    """A domain call as an ``ExecuteToolRequest``; ``None`` becomes ``""``."""
    return pb.ExecuteToolRequest(**{name: value or "" for name, value in request.model_dump().items()})


def call_request_from_pb(message: pb.ExecuteToolRequest) -> CallRequest:
    """An ``ExecuteToolRequest`` as a domain call; empty optional fields become ``None``."""
    optional = {name: getattr(message, name) or None for name in _OPTIONAL_CALL_FIELDS}
    return CallRequest(tool=message.tool, arguments_json=message.arguments_json, **optional)


def batch_to_pb(batch: CallBatch) -> pb.ExecuteToolBatchRequest:
    """A domain batch as an ``ExecuteToolBatchRequest``."""
    return pb.ExecuteToolBatchRequest(calls=[call_request_to_pb(call) for call in batch.calls],
                                      max_concurrency=batch.max_concurrency,
                                      cancel_on_permanent_failure=batch.cancel_on_permanent_failure)


def batch_from_pb(message: pb.ExecuteToolBatchRequest) -> CallBatch:
    """An ``ExecuteToolBatchRequest`` as a domain batch."""
    return CallBatch(calls=tuple(call_request_from_pb(call) for call in message.calls),
                     max_concurrency=message.max_concurrency,
                     cancel_on_permanent_failure=message.cancel_on_permanent_failure)


def batch_results_to_pb(results: tuple[ToolResult, ...]) -> pb.ExecuteToolBatchResponse:
    """A batch's results, in request order, as an ``ExecuteToolBatchResponse``."""
    return pb.ExecuteToolBatchResponse(results=[result_to_pb(result) for result in results])


def batch_results_from_pb(message: pb.ExecuteToolBatchResponse) -> list[ToolResult]:
    """An ``ExecuteToolBatchResponse`` as the batch's domain results, in request order."""
    return [result_from_pb(result) for result in message.results]


def progress_to_pb(update: Progress) -> pb.ToolProgress:
    """A progress report as proto; ``None`` message becomes ``""``, ``None`` total stays unset."""
    return pb.ToolProgress(progress=update.progress, total=update.total, message=update.message or "")


def progress_from_pb(message: pb.ToolProgress) -> Progress:
    """A proto progress report as a domain one."""
    return Progress(progress=message.progress, total=message.total if message.HasField("total") else None,
                    message=message.message or None)


def event_to_pb(event: ToolEvent) -> pb.ToolEvent:
    """A streamed call's event (a progress report or the result) as a proto ``ToolEvent``."""
    if isinstance(event, Progress):
        return pb.ToolEvent(progress=progress_to_pb(event))
    return pb.ToolEvent(result=result_to_pb(event))


def event_from_pb(message: pb.ToolEvent) -> ToolEvent:
    """A proto ``ToolEvent`` as a domain event; ``ValueError`` for one that holds neither."""
    kind = message.WhichOneof("event")
    if kind == "progress":
        return progress_from_pb(message.progress)
    if kind == "result":
        return result_from_pb(message.result)
    raise ValueError("a ToolEvent with neither progress nor result")


def status_to_pb(status: ReloadStatus) -> pb.PolicyStatus:
    return pb.PolicyStatus(source=status.source, revision=status.revision, loaded_at=status.loaded_at,
                           last_attempt_at=status.last_attempt_at or "", last_error=status.last_error or "")


def status_from_pb(message: pb.PolicyStatus) -> ReloadStatus:
    return ReloadStatus(source=message.source, revision=message.revision, loaded_at=message.loaded_at,
                        last_attempt_at=message.last_attempt_at or None, last_error=message.last_error or None)
