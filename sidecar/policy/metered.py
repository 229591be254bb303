"""``MeteredEngine``: counts and times the decisions asked of the engine it wraps (``metrics.listen``).

``toolbooth_policy_decisions_total{stage,allow}``: one per decision, ``allow`` ``true``/``false`` (for
the approval stage ``true`` when no approval is required), ``error`` when the engine could not answer
(``PolicyEvaluationError``, a malformed decision); ``toolbooth_policy_decision_seconds{stage}``: one per
evaluation (a ``decide_many`` of ``ListTools`` is one). It wraps the decision cache, so it sees every
decision the sidecar asks for, answered from the cache or not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sidecar.errors import PolicyEvaluationError
from sidecar.metrics import DecisionMeter, Metrics
from sidecar.policy.decision import Decision, Stage
from sidecar.policy.engine import DelegatingEngine, PolicyEngine
from sidecar.policy.input import PolicyInput

__all__ = ["MeteredEngine"]


class MeteredEngine(DelegatingEngine):
    """``inner``, its decisions counted into ``metrics``."""

    def __init__(self, inner: PolicyEngine, metrics: Metrics) -> None:
        super().__init__(inner)
        self._meters = {stage: metrics.decision(stage.value) for stage in Stage}

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """The wrapped engine's decision, counted and timed."""
        meter, started = self._meters[stage], time.perf_counter()
        try:
            decision = await self.inner.decide(stage, input)
        except PolicyEvaluationError:
            meter.failed.inc()
            raise
        finally:
            meter.seconds.observe(time.perf_counter() - started)
        _count(meter, stage, decision)
        return decision

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """The wrapped engine's decisions, each counted; the evaluation timed once."""
        meter, started = self._meters[stage], time.perf_counter()
        try:
            decisions = await self.inner.decide_many(stage, inputs)
        except PolicyEvaluationError:
            meter.failed.inc(len(inputs))
            raise
        finally:
            meter.seconds.observe(time.perf_counter() - started)
        for decision in decisions:
            _count(meter, stage, decision)
        return decisions


def _count(meter: DecisionMeter, stage: Stage, decision: Decision) -> None:
    allowed = not decision.required if stage is Stage.APPROVAL else decision.allow
    (meter.allowed if allowed else meter.denied).inc()
