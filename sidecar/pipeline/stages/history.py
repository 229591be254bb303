"""Stage 5, history: what of its history the call's policies read, before the authz and approval decisions.

The policy set in force says what it reads (``Decider.history_needs``: its declared meters, whether it reads the
conversation's labels or the call's failures); a set that reads none of it costs nothing here. Otherwise the
``HistorySource`` gives the call its facts (``call.history``), which its authz and approval decisions get as
``input.history`` and ``input.conversation`` (each decision the members its policies may read:
``sidecar.policy.reads``) and the audit log records (``call.trail["history"]``, and which decision got fewer than
all in ``call.trail["history_read"]``); once the call
ended, the source records what it adds to the history (``HistorySource.settle``). Availability, which also
answers listings where there is no call, reads no history.

When the sidecar counts (``metrics.listen``), a call its history stopped is counted by tool and outcome
(``toolbooth_history_calls``): ``rate_limited``, and while its conversation carries labels, ``label_held`` (held for
approval) or ``label_refused`` (denied).
"""

from __future__ import annotations

import asyncio

from sidecar.contract import ErrorCode, Status, ToolResult
from sidecar.errors import CallRefused
from sidecar.metrics import Metrics
from sidecar.pipeline import results
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.history import READ_KEY, TRAIL_KEY, HistorySource, read_by
from sidecar.policy import Stage

__all__ = ["HistoryStage"]


class HistoryStage:
    """Sets ``call.history`` when the policies read history, and settles it once the call ended."""

    def __init__(self, decider: Decider, source: HistorySource, metrics: Metrics | None = None) -> None:
        self._decider, self._source, self._metrics = decider, source, metrics

    async def run(self, call: Call, next: Next) -> ToolResult:
        needs = self._decider.kept_history_needs(call)
        if needs is None:
            needs = await self._decider.history_needs(call)
        if not needs.any:
            return await next(call)
        try:
            seen = await self._source.seen(call, needs)
        except CallRefused as refused:
            call.trail[TRAIL_KEY] = {"error": refused.errors[0].message}
            return results.refused(call, refused)
        call.history = seen
        call.trail[TRAIL_KEY] = seen.document
        if read := read_by(needs):
            call.trail[READ_KEY] = read
        try:
            result = await next(call)
        except asyncio.CancelledError:
            self._source.abandon(call, seen)
            raise
        result = await self._source.settle(call, needs, seen, result)
        if self._metrics is not None:
            self._count(call, result, bool(seen.labels))
        return result

    async def aclose(self) -> None:
        """Finish what the source started in the background."""
        await self._source.aclose()

    def _count(self, call: Call, result: ToolResult, labelled: bool) -> None:
        assert self._metrics is not None
        authz = call.trail.get(Stage.AUTHZ.value) or {}
        if authz.get("code") == ErrorCode.RATE_LIMITED:
            self._metrics.history(call.defn.name, "rate_limited")
        elif labelled and result.status is Status.APPROVAL_REQUIRED:
            self._metrics.history(call.defn.name, "label_held")
        elif labelled and authz and not authz.get("allow"):
            self._metrics.history(call.defn.name, "label_refused")
