"""Stage 2, request: every string field of a call is checked before anything reads, decides or stores it.

A field (``tool``, ``idempotency_key``, ``call_id``, ``conversation_id``, ``approval_id``) must be
valid Unicode, within its bound in bytes of UTF-8 and free of control characters: the rules every
RPC's fields follow (``sidecar.pipeline.fields``). ``arguments_json`` must be valid Unicode (its
size and content are the validate stage's).
A bad field ends the call with ``INVALID_ARGUMENT`` naming it (a bad ``tool``, like any name
that cannot name a tool, with ``TOOL_UNAVAILABLE``); the call is still audited, with the
bad value replaced by ``invalid:sha256:<hex>`` of its bytes, so the event is small, storable and
still tells equal values apart.
"""

from __future__ import annotations

import hashlib

from sidecar.contract import ErrorCode, ErrorInfo, ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.fields import field_message, field_problem
from sidecar.tools.validation import valid_unicode

__all__ = ["INVALID_PREFIX", "RequestStage", "placeholder"]

_CALL_FIELDS = ("tool", "idempotency_key", "call_id", "conversation_id", "approval_id")
INVALID_PREFIX = "invalid:"


class RequestStage:
    """Ends a call whose string fields are malformed, before any other stage sees them."""

    async def run(self, call: Call, next: Next) -> ToolResult:
        request = call.request
        errors, replaced = [], {}
        for name in _CALL_FIELDS:
            value = getattr(request, name)
            if value is not None and (problem := field_problem(name, value)) is not None:
                errors.append(_error(name, problem))
                replaced[name] = placeholder(value)
        if not valid_unicode(request.arguments_json):
            errors.append(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "arguments are not valid UTF-8"))
            replaced["arguments_json"] = placeholder(request.arguments_json)
        if errors:
            call.request = request.model_copy(update=replaced)  # what the audit event and the result show
            raise CallRefused(*errors)
        return await next(call)


def placeholder(value: str) -> str:
    """``invalid:sha256:<hex>`` of ``value``'s bytes (lone surrogates included): what is recorded instead."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{INVALID_PREFIX}sha256:{digest}"


def _error(name: str, problem: str) -> ErrorInfo:
    if name == "tool":  # like any name that cannot name a tool (the resolve stage): unavailable
        return ErrorInfo.of(ErrorCode.TOOL_UNAVAILABLE, f"tool {problem}: no tool has such a name", field=name)
    return ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, field_message(name, problem), field=name)
