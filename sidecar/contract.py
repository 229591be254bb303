"""Domain types shared by every layer: side effects, error codes, recovery, results.

Nothing here knows about gRPC; ``sidecar.api.convert`` maps these types to and
from the protobuf messages of ``proto/toolbooth/v1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

__all__ = [
    "MAX_PROGRESS_MESSAGE_CHARS",
    "RETRY_AFTER_SECONDS",
    "ApprovalResult",
    "CallBatch",
    "CallRequest",
    "ErrorCode",
    "ErrorInfo",
    "Operation",
    "OperationState",
    "Preview",
    "PreviewState",
    "Principal",
    "Progress",
    "Recovery",
    "ReloadStatus",
    "Requester",
    "ResultMeta",
    "SideEffect",
    "Status",
    "ToolDescriptor",
    "ToolEvent",
    "ToolListing",
    "ToolResult",
    "guidance",
]

MAX_PROGRESS_MESSAGE_CHARS = 1000
RETRY_AFTER_SECONDS = "retry_after_seconds"  # in a ``RATE_LIMITED`` error's details: when to try again


class SideEffect(StrEnum):
    """How far a tool's effects reach (reference design, side-effect classes)."""

    NONE = "none"
    INTERNAL_REVERSIBLE = "internal_reversible"
    EXTERNAL_REVERSIBLE = "external_reversible"
    EXTERNAL_IRREVERSIBLE = "external_irreversible"


class ErrorCode(StrEnum):
    """Stable error codes; the table in ``docs/errors.md`` and the proto enum match this."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_NOT_FOUND = "RESOURCE_NOT_FOUND"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    PREVIEW_EXPIRED = "PREVIEW_EXPIRED"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    OPERATION_IN_PROGRESS = "OPERATION_IN_PROGRESS"
    RATE_LIMITED = "RATE_LIMITED"
    TIMEOUT = "TIMEOUT"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    CANCELLED = "CANCELLED"
    POLICY_VIOLATION = "POLICY_VIOLATION"
    PARTIAL_DELIVERY = "PARTIAL_DELIVERY"


class Recovery(StrEnum):
    """What the caller should do next."""

    CORRECT_ARGUMENTS = "correct_arguments"
    DO_NOT_RETRY = "do_not_retry"
    REQUEST_PERMISSION = "request_permission"
    REQUEST_USER_INPUT = "request_user_input"
    CHECK_OPERATION_STATUS = "check_operation_status"
    RETRY_WITH_BACKOFF = "retry_with_backoff"
    RETRY_SAME_REQUEST = "retry_same_request"


class Status(StrEnum):
    """Outcome of one call."""

    SUCCESS = "success"
    PARTIAL_SUCCESS = "partial_success"
    ERROR = "error"
    APPROVAL_REQUIRED = "approval_required"


_GUIDANCE: dict[ErrorCode, tuple[bool, Recovery]] = {
    ErrorCode.INVALID_ARGUMENT: (False, Recovery.CORRECT_ARGUMENTS),
    ErrorCode.TOOL_UNAVAILABLE: (False, Recovery.DO_NOT_RETRY),
    ErrorCode.PERMISSION_DENIED: (False, Recovery.REQUEST_PERMISSION),
    ErrorCode.RESOURCE_NOT_FOUND: (False, Recovery.CORRECT_ARGUMENTS),
    ErrorCode.APPROVAL_REQUIRED: (False, Recovery.REQUEST_USER_INPUT),
    ErrorCode.PREVIEW_EXPIRED: (False, Recovery.REQUEST_USER_INPUT),
    ErrorCode.IDEMPOTENCY_KEY_REUSED: (False, Recovery.CORRECT_ARGUMENTS),
    ErrorCode.OPERATION_IN_PROGRESS: (True, Recovery.CHECK_OPERATION_STATUS),
    ErrorCode.RATE_LIMITED: (True, Recovery.RETRY_WITH_BACKOFF),
    ErrorCode.TIMEOUT: (True, Recovery.RETRY_SAME_REQUEST),
    ErrorCode.SERVICE_UNAVAILABLE: (True, Recovery.RETRY_WITH_BACKOFF),
    ErrorCode.INTERNAL_ERROR: (False, Recovery.DO_NOT_RETRY),
    ErrorCode.CANCELLED: (True, Recovery.RETRY_SAME_REQUEST),
    ErrorCode.POLICY_VIOLATION: (False, Recovery.REQUEST_USER_INPUT),
    ErrorCode.PARTIAL_DELIVERY: (False, Recovery.DO_NOT_RETRY),
}


def guidance(code: ErrorCode, side_effect: SideEffect = SideEffect.NONE) -> tuple[bool, Recovery]:
    """Return ``(retryable, recovery)`` for ``code``.

    A timeout of a tool with side effects may have taken effect, so it is not
    retryable: the caller must check the operation's status instead.
    """
    if code is ErrorCode.TIMEOUT and side_effect is not SideEffect.NONE:
        return False, Recovery.CHECK_OPERATION_STATUS
    return _GUIDANCE[code]


class PreviewState(StrEnum):
    """Where a preview is in its life: pending -> approved | denied; approved -> used (once)."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    USED = "used"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Principal(_Frozen):
    """The authenticated caller. Comes only from trusted context, never from arguments."""

    id: str = Field(min_length=1)
    tenant: str = ""
    roles: tuple[str, ...] = ()
    permissions: tuple[str, ...] = ()

    @property
    def identity(self) -> tuple[str, str]:
        """Who this is, whatever their roles: ``(tenant, id)``; equal for the same caller."""
        return self.tenant, self.id


class ErrorInfo(_Frozen):
    """One error as the model sees it; ``details``: the domain details a tool marked safe to show
    (``ToolError(safe_details=...)``), a JSON object, or ``None``."""

    code: ErrorCode
    message: str
    retryable: bool
    recovery: Recovery
    field: str | None = None
    details: dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        side_effect: SideEffect = SideEffect.NONE,
        details: dict[str, Any] | None = None,
    ) -> ErrorInfo:
        """Build an error with the standard guidance for ``code``."""
        retryable, recovery = guidance(code, side_effect)
        return cls(code=code, message=message, retryable=retryable, recovery=recovery, field=field, details=details)

    @property
    def retry_after_seconds(self) -> int | None:
        """When a ``RATE_LIMITED`` error says to try again (``details.retry_after_seconds``), if it does."""
        value = None if self.details is None else self.details.get(RETRY_AFTER_SECONDS)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class ResultMeta(_Frozen):
    """Facts about how a result was produced. ``truncated``, ``next_cursor`` and ``has_more`` mirror the
    output's own top-level fields of those names, when its model declares them: the tool shortened its
    result on purpose, and says where to read on (``docs/plugins.md``)."""

    request_id: str
    tool: str
    tool_version: str = ""
    duration_ms: int = 0
    attempt: int = 0
    idempotency_replayed: bool = False
    truncated: bool = False
    policy_revision: str = ""
    next_cursor: str | None = None
    has_more: bool = False


class Requester(_Frozen):
    """The principal who asked for a held call (``Preview.requested_by``)."""

    id: str
    tenant: str


class Preview(_Frozen):
    """The exact call a person is asked to approve (``docs/approvals.md``); ``rendering_json``: what the tool
    says the call will do (its ``preview`` renderer's JSON object, also under ``rendering`` in ``call_json``),
    ``None`` for a tool without one. ``tool`` and ``requested_by`` are what the approver rule reads of the call
    (``None`` from a sidecar older than them)."""

    preview_id: str
    preview_hash: str
    call_json: str  # the canonical call the hash covers
    reason: str
    expires_at: str  # RFC 3339, UTC
    state: PreviewState = PreviewState.PENDING
    approver_roles: tuple[str, ...] = ()
    decided_by: str | None = None
    decided_at: str | None = None
    comment: str | None = None
    rendering_json: str | None = None
    created_at: str | None = None  # RFC 3339, UTC: when the call was held
    tool: str | None = None
    requested_by: Requester | None = None


class ToolResult(_Frozen):
    """The typed result of one call: data on success, errors otherwise; a preview when approval is required.
    A ``partial_success`` has both: the data of what was done and, in ``errors``, the parts that failed
    (``error`` is then ``None``)."""

    status: Status
    data: Any = None
    error: ErrorInfo | None = None
    errors: tuple[ErrorInfo, ...] = ()
    meta: ResultMeta
    preview: Preview | None = None


class ApprovalResult(_Frozen):
    """The answer to approving or denying a preview: ``ok``, or why not."""

    ok: bool
    error: ErrorInfo | None = None
    preview: Preview | None = None


class OperationState(StrEnum):
    """Where a keyed call stands (``GetOperation``)."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"  # finished with a stored error result
    UNKNOWN = "unknown"  # its sidecar stopped mid-call: an operator must resolve it
    NOT_FOUND = "not_found"


class Operation(_Frozen):
    """A keyed call's state and, once finished, its stored result."""

    state: OperationState
    result: ToolResult | None = None


class ToolDescriptor(_Frozen):
    """What discovery shows about a tool: its arguments' schema (``input_schema``) and that of a success's
    ``data`` (``output_schema``; empty when unknown); ``title`` is for display (empty: show ``name``)."""

    name: str
    version: str
    description: str
    input_schema: dict[str, Any]
    side_effect: SideEffect
    requires_idempotency_key: bool
    timeout_ms: int
    output_schema: dict[str, Any] = Field(default_factory=dict)
    title: str = ""


class ToolListing(_Frozen):
    """The tools a caller may see, with the policy revision that decided it."""

    tools: tuple[ToolDescriptor, ...]
    policy_revision: str


class CallRequest(_Frozen):
    """One ``ExecuteTool`` request, transport-free."""

    tool: str
    arguments_json: str = ""
    idempotency_key: str | None = None
    approval_id: str | None = None
    conversation_id: str | None = None
    call_id: str | None = None


class CallBatch(_Frozen):
    """One ``ExecuteToolBatch`` request: the calls of one model reply (``docs/agents.md``).

    ``max_concurrency`` 0 means the sidecar's ``limits.max_batch_concurrency``, which also caps it;
    with ``cancel_on_permanent_failure`` the first permanent failure cancels the calls still waiting or
    running, except a call with side effects that has claimed its key: it finishes.
    """

    calls: tuple[CallRequest, ...]
    max_concurrency: int = Field(default=0, ge=0)
    cancel_on_permanent_failure: bool = False


class Progress(_Frozen):
    """Progress a handler reported (``ToolContext.report_progress``); the fields of an MCP progress notification."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    progress: FiniteFloat
    total: FiniteFloat | None = None
    message: str | None = Field(default=None, max_length=MAX_PROGRESS_MESSAGE_CHARS)


ToolEvent = Progress | ToolResult
"""One event of a streamed call: ``Progress`` reports, then its ``ToolResult``, the last event."""


@dataclass(frozen=True, slots=True)
class ReloadStatus:
    """The revision in force and what the last reload attempt did."""

    source: str
    revision: str
    loaded_at: str
    last_attempt_at: str | None = None
    last_error: str | None = None  # set while the latest change is refused

    @property
    def healthy(self) -> bool:
        """False while a change of the source is refused (the old revision still serves)."""
        return self.last_error is None
