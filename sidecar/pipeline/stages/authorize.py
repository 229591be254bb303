"""Stage 6, authorize: the authz policy decides with the validated arguments in its input.

A deny ends the call with the policy's code (``PERMISSION_DENIED``; ``RESOURCE_NOT_FOUND`` where the policy hides
existence; ``POLICY_VIOLATION``; ``RATE_LIMITED``, with the policy's ``retry_after_seconds`` in the error's
``details``) and its public reason; ``internal_reason`` only reaches the audit log.
"""

from __future__ import annotations

from sidecar.contract import RETRY_AFTER_SECONDS, ErrorCode, ErrorInfo, ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.decisions import Decider
from sidecar.policy import Stage

__all__ = ["AuthorizeStage"]


class AuthorizeStage:
    """Passes on only calls the authz policy allows."""

    def __init__(self, decider: Decider) -> None:
        self._decider = decider

    async def run(self, call: Call, next: Next) -> ToolResult:
        decision = await self._decider.decide(call, Stage.AUTHZ)
        if not decision.allow:
            code = decision.code or ErrorCode.PERMISSION_DENIED
            retry = decision.retry_after_seconds
            raise CallRefused(ErrorInfo.of(code, decision.reason or "the call is not permitted",
                                           details=None if retry is None else {RETRY_AFTER_SECONDS: retry}))
        return await next(call)
