"""Policy dry runs (``toolbooth policy eval``): a call's decisions made as the sidecar makes them, nothing executed.

``dry_run`` takes one call through the very stages a real call meets first — resolve +
availability, validation, authz, approval (``sidecar.pipeline.order``) — so the
policies get exactly the input they get in the sidecar, and the run stops where the sidecar
would. Where the call would run, a last stage ends it instead; no preview is opened.
``decide`` is the same over any registry and request (``toolbooth policy replay``, ``sidecar.pipeline.replay``);
``steps_of`` reads the steps from a call's trail, the one a dry run left or one the audit log kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.config import Limits
from sidecar.contract import CallRequest, ErrorInfo, Principal, Status, ToolResult
from sidecar.pipeline import results
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Chain, Next
from sidecar.pipeline.decisions import AUDIT_MASKS, Decider
from sidecar.pipeline.history import GivenHistory, recorded
from sidecar.pipeline.order import DecidingStages
from sidecar.policy import PolicyEngine, Stage
from sidecar.policy.input import tool_json
from sidecar.tools.definition import ToolDefinition
from sidecar.tools.registry import Registry

__all__ = ["STEPS", "VALIDATION", "DryRun", "Step", "Verdict", "decide", "dry_run", "steps_of", "verdict_of"]

VALIDATION = "validation"
STEPS = (Stage.AVAILABILITY.value, VALIDATION, Stage.AUTHZ.value, Stage.APPROVAL.value)


class Verdict(StrEnum):
    """What the sidecar would do with the call."""

    WOULD_RUN = "would_run"
    UNAVAILABLE = "unavailable"
    INVALID_ARGUMENTS = "invalid_arguments"
    DENIED = "denied"
    APPROVAL_REQUIRED = "approval_required"
    POLICY_ERROR = "policy_error"


_STOPS = {Stage.AVAILABILITY.value: Verdict.UNAVAILABLE, VALIDATION: Verdict.INVALID_ARGUMENTS,
          Stage.AUTHZ.value: Verdict.DENIED, Stage.APPROVAL.value: Verdict.APPROVAL_REQUIRED}


@dataclass(frozen=True, slots=True)
class Step:
    """One step reached: a decision (its document), a validation (its errors, or the validated arguments),
    or a policy failure."""

    name: str
    decision: dict[str, Any] | None = None
    errors: tuple[ErrorInfo, ...] = ()
    arguments: dict[str, Any] | None = None
    failure: str = ""

    def document(self) -> dict[str, Any]:
        """The step as JSON data; a decision shows its flag even when false."""
        if self.failure:
            return {"error": self.failure}
        if self.decision is None:
            return {"valid": not self.errors, "arguments": self.arguments,
                    "errors": [error.model_dump(mode="json") for error in self.errors]}
        flag = "required" if self.name == Stage.APPROVAL else "allow"
        return {flag: self.decision.get(flag, False), **self.decision}

    @property
    def passed(self) -> bool:
        """Whether the call goes on past this step."""
        if self.failure:
            return False
        if self.decision is None:
            return self.arguments is not None
        return not self.decision.get("required", False) if self.name == Stage.APPROVAL else bool(
            self.decision.get("allow", False))


@dataclass(frozen=True, slots=True)
class DryRun:
    """A call's steps up to where the sidecar would stop, and its verdict."""

    tool: dict[str, Any]
    principal: Principal
    revision: str
    time: str
    steps: tuple[Step, ...]
    verdict: Verdict
    history: dict[str, Any] | None = None  # the history its decisions read, when its policies read some

    @property
    def not_reached(self) -> list[str]:
        """The steps after the one that stopped the call."""
        return list(STEPS[len(self.steps):])

    def document(self) -> dict[str, Any]:
        """The dry run as JSON data."""
        document = {"tool": self.tool, "principal": self.principal.model_dump(mode="json"), "revision": self.revision,
                    "time": self.time, "steps": {step.name: step.document() for step in self.steps},
                    "not_reached": self.not_reached, "outcome": self.verdict.value}
        if self.history is not None:
            document["history"] = self.history
        return document


class _WouldRun:
    """The last stage of a dry run: where a real call would go on to idempotency and dispatch."""

    async def run(self, call: Call, next: Next) -> ToolResult:
        return results.result(call, Status.SUCCESS)


async def dry_run(engine: PolicyEngine, defn: ToolDefinition[Any, Any], principal: Principal, arguments_json: str,
                  *, limits: Limits, time: str, history: Mapping[str, Any] | None = None,
                  conversation_id: str | None = None) -> DryRun:
    """Availability, validation, authz, approval of one call, by the sidecar's own stages, with the ``history``
    given (``{"history": {"meters", "failures"}, "conversation": {"labels"}}``, parts missing: none) in
    conversation ``conversation_id``; nothing executes."""
    request = CallRequest(tool=defn.name, arguments_json=arguments_json, conversation_id=conversation_id)
    run = await decide(engine, Registry.from_tools([defn]), principal, request, limits=limits, time=time,
                       history=history)
    return DryRun(json.loads(tool_json(defn)), principal, run.revision, time, run.steps, run.verdict, run.history)


async def decide(engine: PolicyEngine, registry: Registry, principal: Principal, request: CallRequest, *,
                 limits: Limits, time: str, history: Mapping[str, Any] | None = None) -> DryRun:
    """The decisions of ``request`` by the deciding stages over ``registry`` at ``time``, with the ``history``
    given (``GivenHistory``); nothing executes."""
    deciding = DecidingStages.build(registry, Decider(engine), limits, history=GivenHistory(history))
    chain = Chain([*deciding, _WouldRun()])
    call = Call(principal, request, engine.revision, time=time)
    result = await chain(call)
    arguments = None if call.arguments is None else call.arguments.data
    steps = steps_of(call.trail, resolved=call.tool is not None, arguments=arguments, errors=result.errors)
    verdict = Verdict.WOULD_RUN if result.status is Status.SUCCESS else _verdict(steps[-1])
    tool = json.loads(call.inputs.tool) if call.inputs is not None else {"name": request.tool}
    seen = recorded(call.trail)
    return DryRun(tool, principal, engine.revision, time, steps, verdict, None if seen is None else seen.document)


def steps_of(trail: dict[str, Any], *, resolved: bool, arguments: dict[str, Any] | None,
             errors: tuple[ErrorInfo, ...] = ()) -> tuple[Step, ...]:
    """The steps a call reached, from its trail: whether the tool resolved (was available), its validated
    arguments (``None``: not valid) and the validation's errors."""
    steps: list[Step] = []
    for name in STEPS:
        if name == VALIDATION:
            if not resolved:
                break
            if arguments is None:
                failed = trail.get(AUDIT_MASKS)
                steps.append(Step(name, failure=failed["error"]) if failed else Step(name, errors=errors))
                break
            steps.append(Step(name, arguments=arguments))
            continue
        document = trail.get(name)
        if document is None:
            break
        steps.append(Step(name, failure=document["error"]) if "error" in document else Step(name, decision=document))
    return tuple(steps)


def verdict_of(steps: tuple[Step, ...]) -> Verdict:
    """The verdict of a complete run of ``steps``: it ran past them all, or stopped at the last."""
    return Verdict.WOULD_RUN if len(steps) == len(STEPS) and steps[-1].passed else _verdict(steps[-1])


def _verdict(last: Step) -> Verdict:
    return Verdict.POLICY_ERROR if last.failure else _STOPS[last.name]
