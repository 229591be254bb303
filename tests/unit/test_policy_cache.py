"""The decision cache: keyed by revision, stage and clock-free input; never stale across revisions."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sidecar.errors import PolicyEvaluationError
from sidecar.policy import Decision, Stage
from sidecar.policy.cache import CachingEngine
from sidecar.policy.input import InputParts, PolicyInput


class CountingEngine:
    """Answers from a script and counts what it was asked."""

    def __init__(self, decision: Decision | None = None) -> None:
        self.revision = "sha256:one"
        self.decision = decision or Decision(allow=True)
        self.asked: list[PolicyInput] = []
        self.fail_next = False

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.asked.append(input)
        if self.fail_next:
            self.fail_next = False
            raise PolicyEvaluationError("engine down")
        return self.decision

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        return [await self.decide(stage, item) for item in inputs]

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        return {}

    async def aclose(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def parts(principal: str = '{"id":"u1"}', tool: str = '{"name":"t"}', time: str = "2026-11-30T15:00:00Z"
          ) -> InputParts:
    return InputParts(principal, tool, time, None)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def inner() -> CountingEngine:
    return CountingEngine()


@pytest.fixture
def engine(inner: CountingEngine, clock: Clock) -> CachingEngine:
    return CachingEngine(inner, max_entries=100, ttl_seconds=5, timer=clock)


async def test_repeated_inputs_are_answered_from_the_cache(engine: CachingEngine, inner: CountingEngine) -> None:
    for _ in range(3):
        assert (await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, '{"arguments":{}}'))).allow
    assert len(inner.asked) == 1


async def test_the_clock_is_not_part_of_the_key(engine: CachingEngine, inner: CountingEngine) -> None:
    await engine.decide(Stage.AVAILABILITY, parts(time="2026-11-30T15:00:00Z").build(Stage.AVAILABILITY))
    await engine.decide(Stage.AVAILABILITY, parts(time="2026-11-30T15:00:01Z").build(Stage.AVAILABILITY))
    assert len(inner.asked) == 1


@pytest.mark.parametrize("other", [
    parts(principal='{"id":"u2"}').build(Stage.AUTHZ, '{"arguments":{}}'),
    parts(tool='{"name":"t2"}').build(Stage.AUTHZ, '{"arguments":{}}'),
    parts().build(Stage.AUTHZ, '{"arguments":{"x":1}}'),
    parts().build(Stage.APPROVAL, '{"arguments":{}}'),
])
async def test_any_other_input_or_stage_is_a_miss(engine: CachingEngine, inner: CountingEngine,
                                                  other: PolicyInput) -> None:
    await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, '{"arguments":{}}'))
    stage = Stage.APPROVAL if '"stage":"approval"' in other.json else Stage.AUTHZ
    await engine.decide(stage, other)
    assert len(inner.asked) == 2


async def test_inputs_without_a_key_are_never_cached(engine: CachingEngine, inner: CountingEngine) -> None:
    for _ in range(2):
        await engine.decide(Stage.AUTHZ, PolicyInput('{"principal":{}}'))
    assert len(inner.asked) == 2


async def test_uncacheable_decisions_are_not_kept(clock: Clock) -> None:
    inner = CountingEngine(Decision(allow=True, cacheable=False))
    engine = CachingEngine(inner, max_entries=10, ttl_seconds=5, timer=clock)
    for _ in range(2):
        await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))
    assert len(inner.asked) == 2


async def test_a_new_revision_never_sees_old_decisions(engine: CachingEngine, inner: CountingEngine) -> None:
    await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))
    inner.revision, inner.decision = "sha256:two", Decision(allow=False)
    assert not (await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))).allow
    assert engine.revision == "sha256:two" and len(inner.asked) == 2


async def test_entries_expire(engine: CachingEngine, inner: CountingEngine, clock: Clock) -> None:
    await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))
    clock.now = 5.1
    await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))
    assert len(inner.asked) == 2


async def test_failures_are_not_cached(engine: CachingEngine, inner: CountingEngine) -> None:
    inner.fail_next = True
    with pytest.raises(PolicyEvaluationError):
        await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))
    assert (await engine.decide(Stage.AVAILABILITY, parts().build(Stage.AVAILABILITY))).allow
    assert len(inner.asked) == 2


async def test_decide_many_mixes_hits_and_misses_in_order(engine: CachingEngine, inner: CountingEngine) -> None:
    first = [parts(tool=f'{{"name":"t{i}"}}').build(Stage.AVAILABILITY) for i in range(4)]
    await engine.decide_many(Stage.AVAILABILITY, first[:2])
    inner.decision = Decision(allow=False)
    decisions = await engine.decide_many(Stage.AVAILABILITY, first)
    assert [d.allow for d in decisions] == [True, True, False, False]
    assert len(inner.asked) == 4
