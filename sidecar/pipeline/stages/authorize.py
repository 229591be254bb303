"""Stage 5, authorize: the authz policy decides with the validated arguments in its input.

A deny ends the call with the policy's code (``PERMISSION_DENIED``, or ``RESOURCE_NOT_FOUND``
where the policy hides existence) and its public reason; ``internal_reason`` only reaches the audit log.
"""

from __future__ import annotations

from sidecar.contract import ErrorCode, ErrorInfo, ToolResult
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
            raise CallRefused(ErrorInfo.of(code, decision.reason or "the call is not permitted"))
        return await next(call)
