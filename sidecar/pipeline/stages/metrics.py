"""Stage 0 (an observer), the metrics of tool calls (``metrics.listen``): around audit, so every call of every
transport counts once.

``toolbooth_tool_calls_total{tool,status,code}`` and ``toolbooth_tool_call_duration_seconds{tool}``:
``tool`` is the registered tool the call resolved to, ``UNKNOWN_TOOL`` when it never did (an unknown
name, a hidden tool, a malformed request), never the name a request sent; ``status`` the result's
status, ``cancelled`` when the caller went away; ``code`` its primary error's code (for a partial
success: its first failed part's), ``NO_CODE`` without one. A batch's call cancelled before its turn never
enters the chain, so it is not counted.
"""

from __future__ import annotations

import asyncio
import time

from sidecar.contract import ErrorCode, ToolResult
from sidecar.metrics import NO_CODE, UNKNOWN_TOOL, Metrics
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next

__all__ = ["MetricsStage"]


class MetricsStage:
    """Counts and times each call into ``metrics``."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def run(self, call: Call, next: Next) -> ToolResult:
        started = time.perf_counter()
        try:
            result = await next(call)
        except asyncio.CancelledError:
            self._ended(call, "cancelled", ErrorCode.CANCELLED.value, started)
            raise
        error = result.error or (result.errors[0] if result.errors else None)
        self._ended(call, result.status.value, NO_CODE if error is None else error.code.value, started)
        return result

    def _ended(self, call: Call, status: str, code: str, started: float) -> None:
        meter = self._metrics.tool(UNKNOWN_TOOL if call.tool is None else call.tool.name)
        meter.ended(status, code, time.perf_counter() - started)
