"""A ``ToolResult`` as an MCP ``CallToolResult``.

``structuredContent`` is the typed result exactly as ``toolbooth call`` prints it (status, data,
error and errors with code/retryable/recovery/field, meta, preview), so it matches the tool's
``outputSchema`` (``sidecar.api.schemas.result_schema``). The same JSON is the one text block, for
clients that show the model only ``content``. ``isError`` is true when the tool did not run to a
result: an error, or approval required (whose ``preview`` is what the client shows an approver).
"""

from __future__ import annotations

import json

from mcp import types

from sidecar.contract import Status, ToolResult

__all__ = ["FAILED", "call_result"]

FAILED = frozenset({Status.ERROR, Status.APPROVAL_REQUIRED})


def call_result(result: ToolResult) -> types.CallToolResult:
    """The MCP answer to a call that ended with ``result``."""
    structured = result.model_dump(mode="json")
    text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=structured,
                                is_error=result.status in FAILED)
