"""``toolbooth policy check``: does a policy directory compile, and do its decisions have the right shape?

``check_policies`` compiles a policy directory (its tests too), checks that the three
entrypoints exist and has the configured engine (``policy.engine``: an OPA server is sent the
directory, as ``serve`` sends it) evaluate them on sample calls (every sample principal, side
effect, and a tool with and without required permissions), reporting each distinct failure once.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sidecar.config import PolicySettings
from sidecar.contract import CallRequest, Principal, SideEffect
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy.decision import CALL_STAGES, RULES, Stage
from sidecar.policy.devtools.runner import defined_rules
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.engines import open_engine
from sidecar.policy.input import CallInput, InputParts, PolicyInput, now_utc, principal_json, tool_json
from sidecar.tools.definition import ToolContext, tool

__all__ = ["SAMPLE_PERMISSIONS", "SAMPLE_PRINCIPALS", "CheckReport", "Problem", "check_policies"]


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

    def document(self, root: Path) -> dict[str, Any]:
        """The findings on ``root`` as JSON data (``--output json``)."""
        return {"root": str(root), "ok": self.ok, "revision": self.revision, "samples": self.samples,
                "problems": [{"message": p.message, "samples": p.samples, "example": p.example}
                             for p in self.problems]}

    def text(self, root: Path) -> str:
        """``OK`` with the revision, or each problem and the sample inputs it showed on."""
        if self.ok:
            return (f"policy check OK: {root}, revision {self.revision}: "
                    f"{len(CALL_STAGES)} entrypoints decided well-typed on {self.samples} sample inputs")
        lines = []
        for problem in self.problems:
            lines.append(f"problem: {problem.message}")
            if problem.samples:
                lines.append(f"  on {problem.samples} of {self.samples} sample inputs, e.g. {problem.example}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Sample:
    """A labelled sample call: the input parts and ``input.call``."""

    label: str
    parts: InputParts
    call: CallInput

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


async def check_policies(settings: PolicySettings, root: Path) -> CheckReport:
    """Compile ``root`` (tests too), then have the configured engine evaluate each defined entrypoint on every
    sample call."""
    try:
        engine = await open_engine(settings, Path(root))
        try:
            return await _check(engine, defined_rules(Path(root)))
        finally:
            await engine.aclose()
    except PolicyLoadError as exc:
        return CheckReport(None, 0, (Problem(str(exc)),))


async def _check(engine: PolicyEngine, defined: set[str]) -> CheckReport:
    """The entrypoints of ``CALL_STAGES`` not ``defined``, and how the defined ones fail on the samples."""
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
                               CallInput.of({}, request)))
    return samples
