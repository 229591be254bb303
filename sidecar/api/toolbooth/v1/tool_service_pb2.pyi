from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATE_UNSPECIFIED: _ClassVar[OperationState]
    OPERATION_STATE_IN_PROGRESS: _ClassVar[OperationState]
    OPERATION_STATE_COMPLETED: _ClassVar[OperationState]
    OPERATION_STATE_FAILED: _ClassVar[OperationState]
    OPERATION_STATE_UNKNOWN: _ClassVar[OperationState]
    OPERATION_STATE_NOT_FOUND: _ClassVar[OperationState]

class PreviewState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREVIEW_STATE_UNSPECIFIED: _ClassVar[PreviewState]
    PREVIEW_STATE_PENDING: _ClassVar[PreviewState]
    PREVIEW_STATE_APPROVED: _ClassVar[PreviewState]
    PREVIEW_STATE_DENIED: _ClassVar[PreviewState]
    PREVIEW_STATE_USED: _ClassVar[PreviewState]

class SideEffect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIDE_EFFECT_UNSPECIFIED: _ClassVar[SideEffect]
    SIDE_EFFECT_NONE: _ClassVar[SideEffect]
    SIDE_EFFECT_INTERNAL_REVERSIBLE: _ClassVar[SideEffect]
    SIDE_EFFECT_EXTERNAL_REVERSIBLE: _ClassVar[SideEffect]
    SIDE_EFFECT_EXTERNAL_IRREVERSIBLE: _ClassVar[SideEffect]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_SUCCESS: _ClassVar[Status]
    STATUS_PARTIAL_SUCCESS: _ClassVar[Status]
    STATUS_ERROR: _ClassVar[Status]
    STATUS_APPROVAL_REQUIRED: _ClassVar[Status]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_TOOL_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_APPROVAL_REQUIRED: _ClassVar[ErrorCode]
    ERROR_CODE_PREVIEW_EXPIRED: _ClassVar[ErrorCode]
    ERROR_CODE_IDEMPOTENCY_KEY_REUSED: _ClassVar[ErrorCode]
    ERROR_CODE_OPERATION_IN_PROGRESS: _ClassVar[ErrorCode]
    ERROR_CODE_RATE_LIMITED: _ClassVar[ErrorCode]
    ERROR_CODE_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_SERVICE_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL_ERROR: _ClassVar[ErrorCode]
    ERROR_CODE_CANCELLED: _ClassVar[ErrorCode]
    ERROR_CODE_POLICY_VIOLATION: _ClassVar[ErrorCode]
    ERROR_CODE_PARTIAL_DELIVERY: _ClassVar[ErrorCode]

class Recovery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECOVERY_UNSPECIFIED: _ClassVar[Recovery]
    RECOVERY_CORRECT_ARGUMENTS: _ClassVar[Recovery]
    RECOVERY_DO_NOT_RETRY: _ClassVar[Recovery]
    RECOVERY_REQUEST_PERMISSION: _ClassVar[Recovery]
    RECOVERY_REQUEST_USER_INPUT: _ClassVar[Recovery]
    RECOVERY_CHECK_OPERATION_STATUS: _ClassVar[Recovery]
    RECOVERY_RETRY_WITH_BACKOFF: _ClassVar[Recovery]
    RECOVERY_RETRY_SAME_REQUEST: _ClassVar[Recovery]
OPERATION_STATE_UNSPECIFIED: OperationState
OPERATION_STATE_IN_PROGRESS: OperationState
OPERATION_STATE_COMPLETED: OperationState
OPERATION_STATE_FAILED: OperationState
OPERATION_STATE_UNKNOWN: OperationState
OPERATION_STATE_NOT_FOUND: OperationState
PREVIEW_STATE_UNSPECIFIED: PreviewState
PREVIEW_STATE_PENDING: PreviewState
PREVIEW_STATE_APPROVED: PreviewState
PREVIEW_STATE_DENIED: PreviewState
PREVIEW_STATE_USED: PreviewState
SIDE_EFFECT_UNSPECIFIED: SideEffect
SIDE_EFFECT_NONE: SideEffect
SIDE_EFFECT_INTERNAL_REVERSIBLE: SideEffect
SIDE_EFFECT_EXTERNAL_REVERSIBLE: SideEffect
SIDE_EFFECT_EXTERNAL_IRREVERSIBLE: SideEffect
STATUS_UNSPECIFIED: Status
STATUS_SUCCESS: Status
STATUS_PARTIAL_SUCCESS: Status
STATUS_ERROR: Status
STATUS_APPROVAL_REQUIRED: Status
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_TOOL_UNAVAILABLE: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_RESOURCE_NOT_FOUND: ErrorCode
ERROR_CODE_APPROVAL_REQUIRED: ErrorCode
ERROR_CODE_PREVIEW_EXPIRED: ErrorCode
ERROR_CODE_IDEMPOTENCY_KEY_REUSED: ErrorCode
ERROR_CODE_OPERATION_IN_PROGRESS: ErrorCode
ERROR_CODE_RATE_LIMITED: ErrorCode
ERROR_CODE_TIMEOUT: ErrorCode
ERROR_CODE_SERVICE_UNAVAILABLE: ErrorCode
ERROR_CODE_INTERNAL_ERROR: ErrorCode
ERROR_CODE_CANCELLED: ErrorCode
ERROR_CODE_POLICY_VIOLATION: ErrorCode
ERROR_CODE_PARTIAL_DELIVERY: ErrorCode
RECOVERY_UNSPECIFIED: Recovery
RECOVERY_CORRECT_ARGUMENTS: Recovery
RECOVERY_DO_NOT_RETRY: Recovery
RECOVERY_REQUEST_PERMISSION: Recovery
RECOVERY_REQUEST_USER_INPUT: Recovery
RECOVERY_CHECK_OPERATION_STATUS: Recovery
RECOVERY_RETRY_WITH_BACKOFF: Recovery
RECOVERY_RETRY_SAME_REQUEST: Recovery

class ExecuteToolBatchRequest(_message.Message):
    __slots__ = ("calls", "max_concurrency", "cancel_on_permanent_failure")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    CANCEL_ON_PERMANENT_FAILURE_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ExecuteToolRequest]
    max_concurrency: int
    cancel_on_permanent_failure: bool
    def __init__(self, calls: _Optional[_Iterable[_Union[ExecuteToolRequest, _Mapping]]] = ..., max_concurrency: _Optional[int] = ..., cancel_on_permanent_failure: _Optional[bool] = ...) -> None: ...

class ExecuteToolBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ...) -> None: ...

class ToolProgress(_message.Message):
    __slots__ = ("progress", "total", "message")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    progress: float
    total: float
    message: str
    def __init__(self, progress: _Optional[float] = ..., total: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class ToolEvent(_message.Message):
    __slots__ = ("progress", "result")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: ToolProgress
    result: ToolResult
    def __init__(self, progress: _Optional[_Union[ToolProgress, _Mapping]] = ..., result: _Optional[_Union[ToolResult, _Mapping]] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("tool", "idempotency_key", "request_id")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tool: str
    idempotency_key: str
    request_id: str
    def __init__(self, tool: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("state", "result")
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    state: OperationState
    result: ToolResult
    def __init__(self, state: _Optional[_Union[OperationState, str]] = ..., result: _Optional[_Union[ToolResult, _Mapping]] = ...) -> None: ...

class Preview(_message.Message):
    __slots__ = ("preview_id", "preview_hash", "call_json", "reason", "expires_at", "state", "approver_roles", "decided_by", "decided_at", "comment", "rendering_json", "created_at", "tool", "requested_by")
    PREVIEW_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_HASH_FIELD_NUMBER: _ClassVar[int]
    CALL_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    APPROVER_ROLES_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    RENDERING_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    preview_id: str
    preview_hash: str
    call_json: str
    reason: str
    expires_at: str
    state: PreviewState
    approver_roles: _containers.RepeatedScalarFieldContainer[str]
    decided_by: str
    decided_at: str
    comment: str
    rendering_json: str
    created_at: str
    tool: str
    requested_by: Requester
    def __init__(self, preview_id: _Optional[str] = ..., preview_hash: _Optional[str] = ..., call_json: _Optional[str] = ..., reason: _Optional[str] = ..., expires_at: _Optional[str] = ..., state: _Optional[_Union[PreviewState, str]] = ..., approver_roles: _Optional[_Iterable[str]] = ..., decided_by: _Optional[str] = ..., decided_at: _Optional[str] = ..., comment: _Optional[str] = ..., rendering_json: _Optional[str] = ..., created_at: _Optional[str] = ..., tool: _Optional[str] = ..., requested_by: _Optional[_Union[Requester, _Mapping]] = ...) -> None: ...

class Requester(_message.Message):
    __slots__ = ("id", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class ApproveOperationRequest(_message.Message):
    __slots__ = ("preview_id", "preview_hash", "comment")
    PREVIEW_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    preview_id: str
    preview_hash: str
    comment: str
    def __init__(self, preview_id: _Optional[str] = ..., preview_hash: _Optional[str] = ..., comment: _Optional[str] = ...) -> None: ...

class DenyOperationRequest(_message.Message):
    __slots__ = ("preview_id", "reason")
    PREVIEW_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    preview_id: str
    reason: str
    def __init__(self, preview_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ApprovalResult(_message.Message):
    __slots__ = ("ok", "error", "preview")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: ToolError
    preview: Preview
    def __init__(self, ok: _Optional[bool] = ..., error: _Optional[_Union[ToolError, _Mapping]] = ..., preview: _Optional[_Union[Preview, _Mapping]] = ...) -> None: ...

class ListPreviewsRequest(_message.Message):
    __slots__ = ("limit", "page_token")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limit: int
    page_token: str
    def __init__(self, limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPreviewsResponse(_message.Message):
    __slots__ = ("previews", "next_page_token")
    PREVIEWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    previews: _containers.RepeatedCompositeFieldContainer[Preview]
    next_page_token: str
    def __init__(self, previews: _Optional[_Iterable[_Union[Preview, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetPolicyStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyStatus(_message.Message):
    __slots__ = ("source", "revision", "loaded_at", "last_attempt_at", "last_error")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    source: str
    revision: str
    loaded_at: str
    last_attempt_at: str
    last_error: str
    def __init__(self, source: _Optional[str] = ..., revision: _Optional[str] = ..., loaded_at: _Optional[str] = ..., last_attempt_at: _Optional[str] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListToolsRequest(_message.Message):
    __slots__ = ("conversation_id",)
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    def __init__(self, conversation_id: _Optional[str] = ...) -> None: ...

class ListToolsResponse(_message.Message):
    __slots__ = ("tools", "policy_revision")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolDescriptor]
    policy_revision: str
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolDescriptor, _Mapping]]] = ..., policy_revision: _Optional[str] = ...) -> None: ...

class ToolDescriptor(_message.Message):
    __slots__ = ("name", "version", "description", "input_schema_json", "side_effect", "requires_idempotency_key", "timeout_ms", "output_schema_json", "title")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECT_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    input_schema_json: str
    side_effect: SideEffect
    requires_idempotency_key: bool
    timeout_ms: int
    output_schema_json: str
    title: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., side_effect: _Optional[_Union[SideEffect, str]] = ..., requires_idempotency_key: _Optional[bool] = ..., timeout_ms: _Optional[int] = ..., output_schema_json: _Optional[str] = ..., title: _Optional[str] = ...) -> None: ...

class ExecuteToolRequest(_message.Message):
    __slots__ = ("tool", "arguments_json", "idempotency_key", "approval_id", "conversation_id", "call_id")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    tool: str
    arguments_json: str
    idempotency_key: str
    approval_id: str
    conversation_id: str
    call_id: str
    def __init__(self, tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., approval_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., call_id: _Optional[str] = ...) -> None: ...

class ToolError(_message.Message):
    __slots__ = ("code", "message", "retryable", "recovery", "field", "details_json")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    retryable: bool
    recovery: Recovery
    field: str
    details_json: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., recovery: _Optional[_Union[Recovery, str]] = ..., field: _Optional[str] = ..., details_json: _Optional[str] = ...) -> None: ...

class ResultMeta(_message.Message):
    __slots__ = ("request_id", "tool", "tool_version", "duration_ms", "attempt", "idempotency_replayed", "truncated", "policy_revision", "next_cursor", "has_more")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_REPLAYED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    POLICY_REVISION_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tool: str
    tool_version: str
    duration_ms: int
    attempt: int
    idempotency_replayed: bool
    truncated: bool
    policy_revision: str
    next_cursor: str
    has_more: bool
    def __init__(self, request_id: _Optional[str] = ..., tool: _Optional[str] = ..., tool_version: _Optional[str] = ..., duration_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., idempotency_replayed: _Optional[bool] = ..., truncated: _Optional[bool] = ..., policy_revision: _Optional[str] = ..., next_cursor: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("status", "data_json", "error", "errors", "meta", "preview")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    status: Status
    data_json: str
    error: ToolError
    errors: _containers.RepeatedCompositeFieldContainer[ToolError]
    meta: ResultMeta
    preview: Preview
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., data_json: _Optional[str] = ..., error: _Optional[_Union[ToolError, _Mapping]] = ..., errors: _Optional[_Iterable[_Union[ToolError, _Mapping]]] = ..., meta: _Optional[_Union[ResultMeta, _Mapping]] = ..., preview: _Optional[_Union[Preview, _Mapping]] = ...) -> None: ...
