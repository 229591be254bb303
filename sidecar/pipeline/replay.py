"""Decision replay (``toolbooth policy replay``): the audit log's decisions made again by a candidate policy set.

An audit event keeps what its call's policy inputs were made of: the principal, the tool and the time
(``decision_input``), the conversation, the idempotency key and the validated arguments, sensitive values
masked (``arguments_json``). ``Recorded.of`` reads that back as the call it was; ``replay`` takes it
through the deciding stages (``sidecar.pipeline.dry_run.decide``, the stages ``toolbooth policy eval``
runs), over a registry of the tool as the call saw it, so every policy gets the input it got then —
masked values masked: a rule that reads one now reads the mask — and the history its decisions read then
(meters, labels, failures: ``call.trail["history"]``), not the history as it is now. The steps reached then and now are
compared stage by stage.

What cannot be replayed is said, not guessed: events from before the decision log (no
``decision_input``), those of calls refused before any decision, and those refused because their history could not be
read (what their decisions would have read is not known) are skipped; a call whose arguments
were never validated (the tool was hidden, or they were invalid) has none recorded, so a candidate
that now lets it further ends there with ``arguments not recorded``. A write audited as
``dispatching`` and again with its outcome is one call, replayed once. An approver's decision (approve, deny)
is not a call: it is neither replayed nor counted as skipped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from sidecar.config import Limits
from sidecar.contract import CallRequest, Principal, SideEffect
from sidecar.pipeline.approval_audit import is_decision_event
from sidecar.pipeline.dry_run import STEPS, VALIDATION, Step, decide, steps_of, verdict_of
from sidecar.pipeline.history import TRAIL_KEY
from sidecar.pipeline.history import recorded as recorded_history
from sidecar.policy import PolicyEngine, Stage
from sidecar.policy.input import InputParts
from sidecar.state import AuditRecord
from sidecar.tools.definition import RetryPolicy, ToolDefinition
from sidecar.tools.registry import Registry

__all__ = ["NOT_REACHED", "NOT_RECORDED", "Change", "Recorded", "ReplayReport", "Skip", "StageChange", "answer",
           "replay", "replay_log"]

NOT_REACHED = "not reached"
NOT_RECORDED = "arguments not recorded"
# The recorded arguments were validated when the call was made; limits are not judged again.
_REPLAY_LIMITS = Limits(max_argument_bytes=1 << 40, max_argument_depth=512)


class Skip(StrEnum):
    """Why an audit event is not replayed."""

    BEFORE_DECISION_LOG = "recorded before decision inputs were kept"
    NO_DECISION = "refused before any decision"
    INCOMPLETE = "cancelled before its decisions were made"
    NO_HISTORY = "refused when its history could not be read"
    UNKNOWN_TOOL = "a tool no plugin had"
    SAME_CALL = "the same call's later event"


@dataclass(frozen=True, slots=True)
class Recorded:
    """One audited call as its decisions saw it, and the steps it reached then."""

    record: AuditRecord
    principal: Principal
    time: str  # ``input.context.time`` of its decisions
    tool: dict[str, Any]  # ``input.tool``
    request: CallRequest
    steps: tuple[Step, ...]
    history: dict[str, Any] | None = None  # the history its authz and approval decisions read, when they read some

    @classmethod
    def of(cls, record: AuditRecord) -> Recorded | Skip:
        """The call of ``record``, or why it cannot be replayed."""
        event = record.event
        if event.decision_ids is None:
            return Skip.BEFORE_DECISION_LOG
        if event.decision_input is None:
            return Skip.NO_DECISION
        parts = InputParts.from_recorded(event.decision_input, event.conversation_id)
        tool = json.loads(parts.tool)
        if not tool["version"]:  # decided on a stand-in, and unavailable whatever the answer
            return Skip.UNKNOWN_TOOL
        arguments = None if event.arguments_json is None else json.loads(event.arguments_json)
        trail = json.loads(event.decisions_json)
        steps = steps_of(trail, resolved=bool(event.tool_version), arguments=arguments)
        if not steps:
            return Skip.NO_DECISION
        if steps[-1].passed and len(steps) < len(STEPS):
            return Skip.NO_HISTORY if "error" in trail.get(TRAIL_KEY, {}) else Skip.INCOMPLETE
        request = CallRequest(tool=event.tool, arguments_json=event.arguments_json or "{}",
                              idempotency_key=event.idempotency_key, conversation_id=event.conversation_id,
                              call_id=event.call_id)
        seen = recorded_history(trail)
        return cls(record, Principal.model_validate_json(parts.principal), parts.time, tool, request, steps,
                   None if seen is None else seen.document)

    @property
    def has_arguments(self) -> bool:
        """Whether its validated (masked) arguments were recorded."""
        return self.record.event.arguments_json is not None

    def registry(self) -> Registry:
        """The tool as the call saw it (``input.tool``), taking the recorded arguments as they are."""
        return Registry.from_tools([ToolDefinition(
            name=self.tool["name"], version=self.tool["version"], description="", handler=_never_run,
            input_model=_RecordedArguments if self.has_arguments else _UnrecordedArguments, output_model=_NoOutput,
            side_effect=SideEffect(self.tool["side_effect"]), permissions=tuple(self.tool["permissions"]),
            timeout=1.0, retry=RetryPolicy(), plugin=self.tool["plugin"])])


@dataclass(frozen=True, slots=True)
class StageChange:
    """One step answered otherwise: ``allow``/``deny``, ``required``/``not required``, ``valid``/``invalid``,
    ``error``, ``not reached``, or ``arguments not recorded``."""

    stage: str
    before: str
    after: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Change:
    """A recorded call the candidate decides otherwise: the outcome then and now, and the steps that differ."""

    recorded: Recorded
    before: str
    after: str
    stages: tuple[StageChange, ...]

    def document(self) -> dict[str, Any]:
        """The change as JSON data."""
        event = self.recorded.record.event
        return {"id": self.recorded.record.id, "request_id": event.request_id, "time": event.time,
                "tool": event.tool, "principal": self.recorded.principal.model_dump(mode="json"),
                "policy_revision": event.policy_revision, "before": self.before, "after": self.after,
                "changes": [{"stage": c.stage, "before": c.before, "after": c.after, "reason": c.reason}
                            for c in self.stages]}


@dataclass(slots=True)
class ReplayReport:
    """What a replay found: the candidate's revision, the calls replayed, those that change, those skipped."""

    revision: str
    replayed: int = 0
    changes: list[Change] = field(default_factory=list)
    skipped: Counter[Skip] = field(default_factory=Counter)

    def document(self) -> dict[str, Any]:
        """The report as JSON data."""
        return {"revision": self.revision, "replayed": self.replayed, "changed": len(self.changes),
                "skipped": {reason.name.lower(): count for reason, count in sorted(self.skipped.items())},
                "changes": [change.document() for change in self.changes]}


async def replay_log(engine: PolicyEngine, records: AsyncIterable[AuditRecord], *, since: str | None = None,
                     tool: str | None = None) -> ReplayReport:
    """Replay every call of ``records`` (oldest first) at or after ``since`` (an event time) of ``tool``."""
    report = ReplayReport(engine.revision)
    dispatched: set[str] = set()  # writes whose ``dispatching`` event was replayed: their outcome is the same call
    async for record in records:
        event = record.event
        if (since is not None and event.time < since) or (tool is not None and event.tool != tool):
            continue
        if is_decision_event(event):  # an approver's, not a call
            continue
        if event.request_id in dispatched:
            dispatched.discard(event.request_id)
            report.skipped[Skip.SAME_CALL] += 1
            continue
        recorded = Recorded.of(record)
        if isinstance(recorded, Skip):
            report.skipped[recorded] += 1
            continue
        if event.status == "dispatching":
            dispatched.add(event.request_id)
        report.replayed += 1
        if (change := await replay(engine, recorded)) is not None:
            report.changes.append(change)
    return report


async def replay(engine: PolicyEngine, recorded: Recorded) -> Change | None:
    """``recorded`` decided again by ``engine`` through the deciding stages; what changed, or ``None``."""
    run = await decide(engine, recorded.registry(), recorded.principal, recorded.request, limits=_REPLAY_LIMITS,
                       time=recorded.time, history=recorded.history)
    then, now = _by_name(recorded.steps), _by_name(run.steps)
    stages = []
    for name in STEPS:
        before, after = answer(then.get(name)), answer(now.get(name))
        if name == VALIDATION and not recorded.has_arguments and after != NOT_REACHED:
            after = before if before != NOT_REACHED else NOT_RECORDED
        if after == NOT_RECORDED and before == NOT_REACHED:
            stages.append(StageChange(name, before, after))
            break
        if before != after and after != NOT_REACHED:  # what the candidate stops no longer reaches: not listed
            stages.append(StageChange(name, before, after, _reason(now.get(name))))
    if not stages:
        return None
    after = NOT_RECORDED if stages[-1].after == NOT_RECORDED else run.verdict.value
    return Change(recorded, verdict_of(recorded.steps).value, after, tuple(stages))


def answer(step: Step | None) -> str:
    """What a step answered, in one word or two."""
    if step is None:
        return NOT_REACHED
    if step.failure:
        return "error"
    if step.decision is None:
        return "valid" if step.arguments is not None else "invalid"
    if step.name == Stage.APPROVAL:
        return "required" if step.decision.get("required") else "not required"
    return "allow" if step.decision.get("allow") else "deny"


def _by_name(steps: tuple[Step, ...]) -> dict[str, Step]:
    return {step.name: step for step in steps}


def _reason(step: Step | None) -> str:
    if step is None:
        return ""
    if step.failure:
        return step.failure
    if step.decision is None:
        return "; ".join(error.message for error in step.errors)
    return " ".join(str(part) for part in (step.decision.get("code"), step.decision.get("reason")) if part)


class _RecordedArguments(BaseModel):
    """The recorded arguments, taken as they are: they were validated when the call was made."""

    model_config = ConfigDict(extra="allow")


class _UnrecordedArguments(BaseModel):
    """A call whose arguments were not recorded: they cannot be validated again."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        raise ValueError(NOT_RECORDED)


class _NoOutput(BaseModel):
    """The replayed tool's output: a replay never runs it."""


async def _never_run(args: BaseModel, ctx: object) -> BaseModel:
    raise AssertionError("a replay never runs a handler")

