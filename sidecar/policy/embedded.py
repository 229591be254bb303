"""The embedded policy engine: Rego evaluated in-process by regorus.

``EmbeddedEngine`` serves a checked ``PolicyFiles`` (``sidecar.policy.files``): the set is
read and checked once, the compiled engine is then reused, and a decision costs tens of
microseconds.

regorus engines are pinned to the thread that creates them (pyo3 ``unsendable``:
any use from another thread panics) and setting the input then evaluating is not
atomic. Checking a set may run on any thread: it compiles a throwaway engine. The
engine that evaluates is built on the first decision, by the thread that makes it,
and only that thread may decide from then on (another thread gets
``PolicyEvaluationError``). In the sidecar that is the event-loop thread, which also
drops the engine after a reload (``aclose``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.errors import PolicyEvaluationError
from sidecar.policy._regorus import regorus
from sidecar.policy.decision import RULES, Decision, Stage, parse_decision
from sidecar.policy.files import (
    PolicyFiles,
    check_files,
    checked_files,
    clean_regorus_error,
    read_audit_masks,
    read_history_needs,
)
from sidecar.policy.history import HistoryNeeds
from sidecar.policy.input import IDEMPOTENCY_KEY, PolicyInput

if TYPE_CHECKING:
    from sidecar.policy.bundle.format import Bundle

__all__ = ["EmbeddedEngine"]


class EmbeddedEngine:
    """``PolicyEngine`` evaluating ``data.toolbooth.<stage>.decision`` with regorus, in-process."""

    def __init__(self, sources: PolicyFiles) -> None:
        self._sources = sources
        self._revision = sources.revision()
        self._reads_key = sources.mentions(IDEMPOTENCY_KEY)
        self._engine: regorus.Engine | None = None
        self._owner: int | None = None

    @classmethod
    def load(cls, path: Path) -> EmbeddedEngine:
        """Read, compile and check the policy directory ``path``; raise ``PolicyLoadError`` naming the file."""
        return cls(checked_files(path))

    @classmethod
    def from_bundle(cls, bundle: Bundle) -> EmbeddedEngine:
        """Compile and check a loaded OPA bundle; the revision is the bundle's."""
        return cls(check_files(bundle.policy_files()))

    @property
    def revision(self) -> str:
        """``sha256:`` and 16 hex digits over the policies' and data's paths and contents, or the bundle's revision."""
        return self._revision

    @property
    def reads_idempotency_key(self) -> bool:
        """Whether the policies or their data mention ``idempotency_key``."""
        return self._reads_key

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """Evaluate one decision."""
        return self._evaluate(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """Evaluate one decision per input, in order."""
        return [self._evaluate(stage, item) for item in inputs]

    def _evaluate(self, stage: Stage, input: PolicyInput) -> Decision:
        rule = RULES[stage]
        value, problem = self._eval_rule(rule, input.json)
        if problem is not None:
            raise PolicyEvaluationError(f"{rule}: {problem}")
        return parse_decision(stage, value)

    def _eval_rule(self, rule: str, input_json: str) -> tuple[Any, str | None]:
        """The rule's value, or regorus's error as text. No exception leaves this frame, which holds the
        regorus engine: a traceback kept alive (a log record, a cycle) and freed by another thread would
        drop the engine there, which regorus forbids."""
        try:
            engine = self._bound_engine()
            engine.set_input_json(input_json)
            return engine.eval_rule(rule), None
        except Exception as exc:  # noqa: BLE001 - regorus raises plain RuntimeError; any failure fails closed
            return None, clean_regorus_error(exc)

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        """``data.toolbooth.audit.mask``, checked (a data key or a rule that does not read the input)."""
        return read_audit_masks(self._bound_engine())

    async def history_needs(self) -> HistoryNeeds:
        """``data.toolbooth.history``, checked, and whether the policies or their data mention labels or failures."""
        return read_history_needs(self._bound_engine(), self._sources)

    async def aclose(self) -> None:
        """Drop the compiled engine here, on its thread: left to the garbage collector, it
        could be dropped by whichever thread collects it, which regorus forbids."""
        if self._owner == threading.get_ident():
            self._engine = self._owner = None

    def _bound_engine(self) -> regorus.Engine:
        """The evaluating engine: built by the first thread that decides, usable only by that thread."""
        if self._engine is None:
            self._engine, self._owner = self._sources.build(), threading.get_ident()
        elif self._owner != threading.get_ident():
            raise RuntimeError("the embedded engine evaluates on the thread of its first decision only")
        return self._engine
