"""Policy dry runs: decisions made as the sidecar makes them, with nothing executed.

``dry_run`` takes one call through availability, argument validation, authz and
approval, in the pipeline's order, and stops where the pipeline would.
``check_policies`` compiles a policy directory (its tests too), checks that the three
entrypoints exist and evaluates them on sample calls (every sample principal, side
effect, and a tool with and without required permissions), reporting each distinct
failure once.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sidecar.config import Limits
from sidecar.contract import CallRequest, ErrorInfo, Principal, SideEffect
from sidecar.errors import ArgumentError, PolicyEvaluationError, PolicyLoadError
from sidecar.policy import CALL_STAGES, RULES, Decision, PolicyEngine, Stage
from sidecar.policy.devtools.runner import defined_rules
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import InputParts, PolicyInput, call_json, now_utc, principal_json, tool_json
from sidecar.tools.definition import ToolContext, ToolDefinition, tool
from sidecar.tools.validation import parse_arguments

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


_STOPS = {Stage.AVAILABILITY: Verdict.UNAVAILABLE, Stage.AUTHZ: Verdict.DENIED,
          Stage.APPROVAL: Verdict.APPROVAL_REQUIRED}


@dataclass(frozen=True, slots=True)
class Step:
    """One step reached: a decision, a validation (its errors, or the validated arguments), or a policy failure."""

    name: str
    decision: Decision | None = None
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
        return {flag: getattr(self.decision, flag), **self.decision.document()}


@dataclass(frozen=True, slots=True)
class DryRun:
    """A call's steps up to where the sidecar would stop, and its verdict."""

    tool: dict[str, Any]
    principal: Principal
    revision: str
    time: str
    steps: tuple[Step, ...]
    verdict: Verdict

    @property
    def not_reached(self) -> list[str]:
        """The steps after the one that stopped the call."""
        return list(STEPS[len(self.steps):])

    def document(self) -> dict[str, Any]:
        """The dry run as JSON data."""
        return {"tool": self.tool, "principal": self.principal.model_dump(mode="json"), "revision": self.revision,
                "time": self.time, "steps": {step.name: step.document() for step in self.steps},
                "not_reached": self.not_reached, "outcome": self.verdict.value}


async def dry_run(engine: PolicyEngine, defn: ToolDefinition[Any, Any], principal: Principal, arguments_json: str,
                  *, limits: Limits, time: str) -> DryRun:
    """Availability, validation, authz, approval of one call, as the pipeline runs them; nothing executes."""
    parts = InputParts(principal_json(principal), tool_json(defn), time, None)
    steps: list[Step] = []
    verdict = await _run(engine, defn, parts, arguments_json, limits, steps)
    return DryRun(json.loads(parts.tool), principal, engine.revision, time, tuple(steps), verdict)


async def _run(engine: PolicyEngine, defn: ToolDefinition[Any, Any], parts: InputParts, arguments_json: str,
               limits: Limits, steps: list[Step]) -> Verdict:
    """Append each step reached to ``steps``; the verdict."""
    if stop := await _decide(engine, Stage.AVAILABILITY, parts.build(Stage.AVAILABILITY), steps):
        return stop
    try:
        args = parse_arguments(arguments_json, defn.input_model, max_bytes=limits.max_argument_bytes,
                               max_depth=limits.max_argument_depth)
    except ArgumentError as exc:
        steps.append(Step(VALIDATION, errors=tuple(exc.errors)))
        return Verdict.INVALID_ARGUMENTS
    arguments = args.model_dump(mode="json")
    steps.append(Step(VALIDATION, arguments=arguments))
    call = call_json(arguments, CallRequest(tool=defn.name, arguments_json=arguments_json))
    for stage in (Stage.AUTHZ, Stage.APPROVAL):
        if stop := await _decide(engine, stage, parts.build(stage, call), steps):
            return stop
    return Verdict.WOULD_RUN


async def _decide(engine: PolicyEngine, stage: Stage, input: PolicyInput, steps: list[Step]) -> Verdict | None:
    """Append one decision to ``steps``; the verdict when it stops the call."""
    try:
        decision = await engine.decide(stage, input)
    except PolicyEvaluationError as exc:
        steps.append(Step(stage.value, failure=str(exc)))
        return Verdict.POLICY_ERROR
    steps.append(Step(stage.value, decision=decision))
    stops = decision.required if stage is Stage.APPROVAL else not decision.allow
    return _STOPS[stage] if stops else None


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong with the policies; ``samples``: on how many sample inputs it showed, ``example``: one."""

    message: str
    samples: int = 0
    example: str = ""


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What ``check_policies`` found; ``revision`` is ``None`` when the policies do not load."""

    revision: str | None
    samples: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.problems


@dataclass(frozen=True, slots=True)
class _Sample:
    """A labelled sample call: the input parts and ``input.call``."""

    label: str
    parts: InputParts
    call: str

    def input(self, stage: Stage) -> PolicyInput:
        """The input of ``stage`` (availability has no ``call``, as in the sidecar)."""
        return self.parts.build(stage, None if stage is Stage.AVAILABILITY else self.call)


SAMPLE_PRINCIPALS = (
    Principal(id="admin", tenant="t1", roles=("admin",)),
    Principal(id="developer", tenant="t1", roles=("developer",)),
    Principal(id="reader", tenant="t2", roles=("reader",)),
    Principal(id="no-roles", tenant="t2", permissions=("files:read",)),
)
SAMPLE_PERMISSIONS: tuple[tuple[str, ...], ...] = ((), ("files:read",))


class _NoArguments(BaseModel):
    pass


@tool(name="policy_check_sample", version="1.0.0", side_effect=SideEffect.NONE)
async def _sample_tool(args: _NoArguments, ctx: ToolContext) -> _NoArguments:
    """Never runs: only its metadata goes into sample inputs."""
    return args


async def check_policies(root: Path) -> CheckReport:
    """Compile ``root`` (tests too), then evaluate each defined entrypoint on every sample call."""
    try:
        engine = EmbeddedEngine.load(Path(root))
        defined = defined_rules(Path(root))
    except PolicyLoadError as exc:
        return CheckReport(None, 0, (Problem(str(exc)),))
    problems = [Problem(f"{RULES[stage]} is not defined") for stage in CALL_STAGES if RULES[stage] not in defined]
    samples = _samples()
    failures: dict[str, list[str]] = {}
    for sample, stage in itertools.product(samples, [stage for stage in CALL_STAGES if RULES[stage] in defined]):
        try:
            await engine.decide(stage, sample.input(stage))
        except PolicyEvaluationError as exc:
            failures.setdefault(str(exc), []).append(sample.label)
    problems += [Problem(message, len(labels), labels[0]) for message, labels in failures.items()]
    return CheckReport(engine.revision, len(samples), tuple(problems))


def _samples() -> list[_Sample]:
    """Every sample principal calling a tool of every side effect, with and without required permissions."""
    now = now_utc()
    samples = []
    for principal, side_effect, permissions in itertools.product(SAMPLE_PRINCIPALS, SideEffect, SAMPLE_PERMISSIONS):
        defn = dataclasses.replace(_sample_tool, side_effect=side_effect, permissions=permissions)
        needs = f"requiring {', '.join(permissions)}" if permissions else "without permissions"
        request = CallRequest(tool=defn.name, idempotency_key="policy-check", conversation_id="policy-check")
        samples.append(_Sample(f"{principal.id} calling a '{side_effect}' tool {needs}",
                               InputParts(principal_json(principal), tool_json(defn), now, request.conversation_id),
                               call_json({}, request)))
    return samples
