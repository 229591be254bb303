"""Policy dry runs: decisions made as the sidecar makes them, with nothing executed.

``dry_run`` takes one call through the very stages a real call meets first — resolve +
availability, validation, authz, approval (``sidecar.bootstrap.dry_run_chain``) — so the
policies get exactly the input they get in the sidecar, and the run stops where the sidecar
would. Where the call would run, a last stage ends it instead; no preview is opened.
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

from sidecar.bootstrap import dry_run_chain
from sidecar.config import Limits
from sidecar.contract import CallRequest, ErrorInfo, Principal, SideEffect, Status, ToolResult
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.pipeline import results
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.decisions import AUDIT_MASKS
from sidecar.policy import CALL_STAGES, RULES, PolicyEngine, Stage
from sidecar.policy.devtools.runner import defined_rules
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import InputParts, PolicyInput, call_json, now_utc, principal_json, tool_json
from sidecar.tools.definition import ToolContext, ToolDefinition, tool
from sidecar.tools.registry import Registry

__all__ = ["SAMPLE_PRINCIPALS", "STEPS", "VALIDATION", "CheckReport", "DryRun", "Problem", "Step", "Verdict",
           "check_policies", "dry_run"]

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


class _WouldRun:
    """The last stage of a dry run: where a real call would go on to idempotency and dispatch."""

    async def run(self, call: Call, next: Next) -> ToolResult:
        return results.result(call, Status.SUCCESS)


async def dry_run(engine: PolicyEngine, defn: ToolDefinition[Any, Any], principal: Principal, arguments_json: str,
                  *, limits: Limits, time: str) -> DryRun:
    """Availability, validation, authz, approval of one call, by the sidecar's own stages; nothing executes."""
    chain = dry_run_chain(Registry.from_tools([defn]), engine, limits, _WouldRun())
    call = Call(principal, CallRequest(tool=defn.name, arguments_json=arguments_json), engine.revision, time=time)
    result = await chain(call)
    steps = _steps(call, result)
    verdict = Verdict.WOULD_RUN if result.status is Status.SUCCESS else _verdict(steps[-1])
    return DryRun(json.loads(tool_json(defn)), principal, engine.revision, time, steps, verdict)


def _steps(call: Call, result: ToolResult) -> tuple[Step, ...]:
    """The steps ``call`` reached, from what the stages recorded on it."""
    steps: list[Step] = []
    for name in STEPS:
        if name == VALIDATION:
            if call.tool is None:
                break
            if call.arguments is None:
                failed = call.trail.get(AUDIT_MASKS)
                steps.append(Step(name, failure=failed["error"]) if failed else Step(name, errors=result.errors))
                break
            steps.append(Step(name, arguments=call.arguments.data))
            continue
        document = call.trail.get(name)
        if document is None:
            break
        steps.append(Step(name, failure=document["error"]) if "error" in document else Step(name, decision=document))
    return tuple(steps)


def _verdict(last: Step) -> Verdict:
    return Verdict.POLICY_ERROR if last.failure else _STOPS[last.name]


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
