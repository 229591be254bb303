"""Stage 0 (an observer), the log context of a call: every line written while it runs through the chain carries
its request id, tool and caller (``sidecar.telemetry.call_log``). Outermost but for the trace stage, so the audit
stage's lines carry them too."""

from __future__ import annotations

from sidecar.contract import ToolResult
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.telemetry.call_log import in_call

__all__ = ["LogContextStage"]


class LogContextStage:
    """Runs each call as the call its log lines are written during."""

    async def run(self, call: Call, next: Next) -> ToolResult:
        span = None if call.trace is None else call.trace.span.get_span_context()
        with in_call(call.request_id, call.request.tool, call.principal.id, span):
            return await next(call)
