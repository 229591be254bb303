"""Asking the policy engine on behalf of a call: one place that records decisions and fails closed.

Every decision is written to the call's trail (the audit log shows it, failures included), under a
decision id of its own (a UUID, as OPA's decision log names decisions), and, when the sidecar traces, made
in a span ``policy {stage}`` (attribute ``toolbooth.policy.allow``, for the approval stage
``toolbooth.policy.required``). An engine that cannot answer refuses the call through
``sidecar.errors.refusal``: nothing after the stage that asked runs.
"""

from __future__ import annotations

import logging
import uuid

from sidecar.errors import CallRefused, PolicyEvaluationError, refusal
from sidecar.pipeline.call import Call
from sidecar.policy import Decision, PolicyEngine, Stage

__all__ = ["AUDIT_MASKS", "Decider"]

AUDIT_MASKS = "audit_masks"  # the trail entry of a failure to read ``data.toolbooth.audit.mask``

log = logging.getLogger("toolbooth.pipeline")


class Decider:
    """Makes a call's policy decisions and reads the policy's audit masks (once per revision)."""

    def __init__(self, policy: PolicyEngine) -> None:
        self.policy = policy
        self._masks: tuple[str, dict[str, tuple[str, ...]]] = ("", {})  # (revision, tool -> pointers)

    async def decide(self, call: Call, stage: Stage) -> Decision:
        """``stage``'s decision for ``call`` (``input.call`` once its arguments are valid)."""
        assert call.inputs is not None, "the resolve stage must run first"
        arguments = call.arguments.call if call.arguments is not None else None
        call.decision_ids[stage.value] = str(uuid.uuid4())
        with call.span("policy", stage.value) as span:
            try:
                decision = await self.policy.decide(stage, call.inputs.build(stage, arguments))
            except PolicyEvaluationError as exc:
                log.error("policy %s failed for request %s: %s", stage, call.request_id, exc)
                call.trail[stage.value] = {"error": str(exc)}
                failure = refusal(exc)
                if span is not None:
                    span.set_attribute("error.type", failure.code.value)
            else:
                call.trail[stage.value] = decision.document()
                if span is not None and stage is Stage.APPROVAL:
                    span.set_attribute("toolbooth.policy.required", decision.required)
                elif span is not None:
                    span.set_attribute("toolbooth.policy.allow", decision.allow)
                return decision
        raise CallRefused(failure)  # outside the handler: the refusal keeps no engine's traceback alive

    async def masked(self, call: Call, tool: str) -> tuple[str, ...]:
        """The pointers ``data.toolbooth.audit.mask`` lists for ``tool``, read once per policy revision."""
        revision = self.policy.revision
        if self._masks[0] != revision:
            self._masks = (revision, await self._read_masks(call))
        return self._masks[1].get(tool, ())

    async def _read_masks(self, call: Call) -> dict[str, tuple[str, ...]]:
        try:
            return await self.policy.audit_masks()
        except PolicyEvaluationError as exc:
            log.error("audit masks could not be read for request %s: %s", call.request_id, exc)
            call.trail[AUDIT_MASKS] = {"error": str(exc)}
            failure = refusal(exc)
        raise CallRefused(failure)
