"""Asking the policy engine on behalf of a call: one place that records decisions and fails closed.

Every decision is written to the call's trail (the audit log shows it, failures included), under a
decision id of its own (a UUID, as OPA's decision log names decisions), and, when the sidecar traces, noted
for the call's ``policy`` span (attribute ``toolbooth.policy.{stage}.allow``, for the approval stage
``toolbooth.policy.approval.required``; ``toolbooth.policy.{stage}.error`` when the engine failed). An
engine that cannot answer refuses the call through ``sidecar.errors.refusal``: nothing after the stage
that asked runs. A call's decisions and its audit masks come from one policy set, the one in force at its
first decision (``sidecar.policy.reload.new_pin``), whose revision the call records: a reload meanwhile does not
reach them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sidecar.errors import CallRefused, PolicyEvaluationError, refusal
from sidecar.ids import random_uuid
from sidecar.pipeline.call import Call
from sidecar.policy import Decision, PolicyEngine, Stage
from sidecar.policy.history import NO_HISTORY, HistoryNeeds
from sidecar.policy.input import CallInput
from sidecar.policy.reads import ALL_MEMBERS
from sidecar.policy.reload import new_pin

__all__ = ["AUDIT_MASKS", "HISTORY_NEEDS", "Decider"]

AUDIT_MASKS = "audit_masks"  # the trail entry of a failure to read ``data.toolbooth.audit.mask``
HISTORY_NEEDS = "history_needs"  # the trail entry of a failure to read what of its history a call's policies read
T = TypeVar("T")

log = logging.getLogger("toolbooth.pipeline")
_NAMES = {stage: stage.value for stage in Stage}  # faster than ``Stage.value``, read three times per call

class Decider:
    """Makes a call's policy decisions, and reads the policy's audit masks and history needs (once per revision)."""

    def __init__(self, policy: PolicyEngine) -> None:
        self.policy = policy
        self._masks: _Kept[dict[str, tuple[str, ...]]] = _Kept("", {})  # tool -> pointers
        self._needs: _Kept[HistoryNeeds] = _Kept("", NO_HISTORY)

    async def decide(self, call: Call, stage: Stage) -> Decision:
        """``stage``'s decision for ``call`` (``input.call`` once its arguments are valid)."""
        assert call.inputs is not None, "the resolve stage must run first"
        name = _NAMES[stage]
        arguments = call.arguments.call if call.arguments is not None else None
        call.decision_ids[name] = random_uuid()
        if call.trace is None:  # no span to note it for: the common case, without entering an empty context
            return self._made(call, stage, await self._asked(call, stage, arguments))
        with call.deciding(name) as outcome:
            decided = await self._asked(call, stage, arguments)
            if outcome is not None:
                if isinstance(decided, CallRefused):
                    outcome.failed(decided.errors[0].code.value)
                elif stage is Stage.APPROVAL:
                    outcome.set("required", decided.required)
                else:
                    outcome.set("allow", decided.allow)
        return self._made(call, stage, decided)

    async def _asked(self, call: Call, stage: Stage, arguments: CallInput | None) -> Decision | CallRefused:
        """The engine's decision, or the refusal of a call whose decision failed (trail written)."""
        assert call.inputs is not None
        pin = call.pin
        if pin is None:  # its first decision: the pin of this call, in this task (and those it starts)
            pin = call.pin = new_pin()
        pin.deciding = True
        try:
            if stage is Stage.AVAILABILITY:  # a call's first decision: its revision is the set it is pinned to
                call.policy_revision = self.policy.revision
            history = call.history
            return await self.policy.decide(stage, call.inputs.build(
                stage, arguments, None if history is None else history.json_of(self._members(call, stage))))
        except PolicyEvaluationError as exc:
            log.error("policy %s failed for request %s: %s", stage, call.request_id, exc)
            call.trail[_NAMES[stage]] = {"error": str(exc)}
            return CallRefused(refusal(exc))
        finally:
            pin.deciding = False

    @staticmethod
    def _made(call: Call, stage: Stage, decided: Decision | CallRefused) -> Decision:
        if isinstance(decided, CallRefused):
            raise decided  # raised here, not in the engine's handler: it keeps no engine's traceback alive
        call.trail[_NAMES[stage]] = decided.document()
        return decided

    def _members(self, call: Call, stage: Stage) -> frozenset[str]:
        """What of the call's history ``stage``'s decision gets: what its policies may read (all, if not known)."""
        needs = self.kept_history_needs(call)
        return ALL_MEMBERS if needs is None else needs.members(stage)

    async def masked(self, call: Call, tool: str) -> tuple[str, ...]:
        """The pointers ``data.toolbooth.audit.mask`` lists for ``tool`` in the call's policy set, read once per
        policy revision."""
        masks = await self._per_revision(call, self._masks, self._read_masks)
        return masks.get(tool, ())

    def kept_history_needs(self, call: Call) -> HistoryNeeds | None:
        """``history_needs`` when they are already read for the call's policy set (most calls: nothing to await)."""
        kept = self._needs
        return kept.value if call.pin is not None and kept.revision == call.policy_revision else None

    async def history_needs(self, call: Call) -> HistoryNeeds:
        """What of a call's history the call's policy set reads, read once per policy revision."""
        return await self._per_revision(call, self._needs, self._read_needs)

    async def _per_revision(self, call: Call, kept: _Kept[T], read: Callable[[Call], Awaitable[T]]) -> T:
        """``kept``'s value for the call's policy set, read by ``read`` when the revision changed."""
        pin = call.pin
        if pin is not None and kept.revision == call.policy_revision:  # decided on the set whose value is kept
            return kept.value
        if pin is None:  # its first decision: the pin of this call, in this task (and those it starts)
            pin = call.pin = new_pin()
        pin.deciding = True
        try:
            revision = self.policy.revision
            if kept.revision != revision:
                kept.value, kept.revision = await read(call), revision
        finally:
            pin.deciding = False
        return kept.value

    async def _read_masks(self, call: Call) -> dict[str, tuple[str, ...]]:
        return await self._read(call, AUDIT_MASKS, "audit masks", self.policy.audit_masks)

    async def _read_needs(self, call: Call) -> HistoryNeeds:
        return await self._read(call, HISTORY_NEEDS, "the history the policies read", self.policy.history_needs)

    @staticmethod
    async def _read(call: Call, entry: str, what: str, read: Callable[[], Awaitable[T]]) -> T:
        try:
            return await read()
        except PolicyEvaluationError as exc:
            log.error("%s could not be read for request %s: %s", what, call.request_id, exc)
            call.trail[entry] = {"error": str(exc)}
            failure = refusal(exc)
        raise CallRefused(failure)


@dataclass(slots=True)
class _Kept(Generic[T]):
    """A value read from the policy set of ``revision``."""

    revision: str
    value: T
