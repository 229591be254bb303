"""Stage 9, consume approval: the approval stage (7) only checked the call's approval (``call.approved``); it is
spent here.

It runs right before dispatch, after the idempotency stage (8) claimed the call's key: a call whose key is in
progress, reused for another request or replayed never gets here, so it spends no approval. The approval is
used once, atomically (of concurrent calls with other keys one runs: ``Approvals.consume``), and given back if
the call certainly had no effect (``had_no_effect``: its handler never started, or said nothing happened).
Each store operation is a span ``store {operation}`` when the sidecar traces.
"""

from __future__ import annotations

from sidecar.contract import ToolResult
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.stages.approval_guard import guarding_key, refused
from sidecar.pipeline.stages.idempotency import had_no_effect

__all__ = ["ConsumeApprovalStage"]


class ConsumeApprovalStage:
    """Uses the checked approval once, right before dispatch; gives it back if the call certainly had no effect."""

    def __init__(self, approvals: Approvals) -> None:
        self._approvals = approvals

    async def run(self, call: Call, next: Next) -> ToolResult:
        approval_id = call.request.approval_id
        if call.approved is None or approval_id is None:  # no approval was checked: none to spend
            return await next(call)
        with call.span("store", "consume_approval"):
            denied = await self._approvals.consume(approval_id, key=guarding_key(call))
        if denied is not None:
            raise refused(denied)
        result = await next(call)
        if had_no_effect(call, result):
            await self._approvals.restore(approval_id)
        return result
