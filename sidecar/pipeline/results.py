"""The result of a call: every ``ToolResult`` is built here, by the stage that ends the call (dispatch, stage 10,
or any stage's refusal).

Its ``meta`` says how it was produced (request id, tool and version, duration, attempts,
policy revision) and, for a tool whose output model declares them (``ToolDefinition.page_fields``),
mirrors the output's ``truncated``, ``next_cursor`` and ``has_more``: the tool shortened its result
on purpose and says where to read on. A success whose data is above ``limits.max_result_bytes`` is
never returned truncated: it becomes an ``INTERNAL_ERROR`` naming the size.

A handler's ``Partial`` becomes a ``partial_success``: its data, and its failed parts as ``errors``
(``error`` stays ``None``: the call did not fail as a whole).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sidecar.contract import ErrorCode, ErrorInfo, Preview, ResultMeta, Status, ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call

__all__ = ["error", "refused", "replayed", "result", "success"]

log = logging.getLogger("toolbooth.pipeline")


def result(call: Call, status: Status, *, data: Any = None, errors: tuple[ErrorInfo, ...] = (),
           preview: Preview | None = None) -> ToolResult:
    """A result of ``call`` with ``status``; ``errors[0]`` is its primary error (a partial success has none)."""
    primary = errors[0] if errors and status is not Status.PARTIAL_SUCCESS else None
    return ToolResult(status=status, data=data, error=primary, errors=errors, meta=_meta(call, data),
                      preview=preview)


def refused(call: Call, refusal: CallRefused) -> ToolResult:
    """The result of a call a stage ended with ``refusal``."""
    return result(call, refusal.status, errors=refusal.errors, preview=refusal.preview)


def error(call: Call, info: ErrorInfo) -> ToolResult:
    """An error result with one error."""
    return result(call, Status.ERROR, errors=(info,))


def success(call: Call, data: Any, *, max_bytes: int, failed: tuple[ErrorInfo, ...] = ()) -> ToolResult:
    """A success carrying ``data`` (JSON data) — partial, with the ``failed`` parts' errors, if any — or an
    error if it is larger than ``max_bytes``."""
    size = len(json.dumps(data, separators=(",", ":")).encode())
    if size > max_bytes:
        log.error("tool %r returned %d bytes (limit %d)", call.request.tool, size, max_bytes)
        return error(call, ErrorInfo.of(ErrorCode.INTERNAL_ERROR, f"the tool's result is {size} bytes, above the "
                                        f"limit of {max_bytes}; it was not returned"))
    return result(call, Status.PARTIAL_SUCCESS if failed else Status.SUCCESS, data=data, errors=failed)


def replayed(call: Call, result_json: str) -> ToolResult:
    """A stored result replayed for a retry: its own meta, under this call's request id."""
    stored = ToolResult.model_validate_json(result_json)
    meta = stored.meta.model_copy(update={"request_id": call.request_id, "idempotency_replayed": True})
    return stored.model_copy(update={"meta": meta})


def _meta(call: Call, data: Any) -> ResultMeta:
    tool = call.tool
    page = {name: data[name] for name in tool.page_fields if name in data} if (
        tool is not None and isinstance(data, dict)) else {}
    return ResultMeta(request_id=call.request_id, tool=call.request.tool,
                      tool_version=tool.version if tool else "", duration_ms=call.elapsed_ms,
                      attempt=call.attempts, policy_revision=call.policy_revision, **page)
