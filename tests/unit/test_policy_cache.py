"""The decision cache: keyed by revision, stage and clock-free input; never stale across revisions."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from sidecar.errors import PolicyEvaluationError
from sidecar.policy import Decision, Stage
from sidecar.policy.cache import CachingEngine, Generations
from sidecar.policy.input import CallInput, InputBatch, InputParts, PolicyInput


class CountingEngine:
    """Answers from a script and counts what it was asked."""

    def __init__(self, decision: Decision | None = None) -> None:
        self.revision = "sha256:one"
        self.reads_idempotency_key = False
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


def call(arguments: str = "{}", key: str | None = None) -> CallInput:
    return CallInput(arguments, None, key)


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
        assert (await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, call()))).allow
    assert len(inner.asked) == 1


async def test_the_clock_is_not_part_of_the_key(engine: CachingEngine, inner: CountingEngine) -> None:
    await engine.decide(Stage.AVAILABILITY, parts(time="2026-11-30T15:00:00Z").build(Stage.AVAILABILITY))
    await engine.decide(Stage.AVAILABILITY, parts(time="2026-11-30T15:00:01Z").build(Stage.AVAILABILITY))
    assert len(inner.asked) == 1


@pytest.mark.parametrize("other", [
    parts(principal='{"id":"u2"}').build(Stage.AUTHZ, call()),
    parts(tool='{"name":"t2"}').build(Stage.AUTHZ, call()),
    parts().build(Stage.AUTHZ, call('{"x":1}')),
    parts().build(Stage.APPROVAL, call()),
])
async def test_any_other_input_or_stage_is_a_miss(engine: CachingEngine, inner: CountingEngine,
                                                  other: PolicyInput) -> None:
    await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, call()))
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


async def test_the_idempotency_key_is_left_out_where_no_policy_reads_it(engine: CachingEngine,
                                                                       inner: CountingEngine) -> None:
    for key in ("k-1", "k-2", None):
        assert (await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, call(key=key)))).allow
    assert len(inner.asked) == 1


async def test_the_idempotency_key_is_kept_where_a_policy_may_read_it(inner: CountingEngine, clock: Clock) -> None:
    inner.reads_idempotency_key = True
    engine = CachingEngine(inner, max_entries=10, ttl_seconds=5, timer=clock)
    for key in ("k-1", "k-2", "k-1", None):
        await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, call(key=key)))
    assert [json.loads(asked.json)["call"]["idempotency_key"] for asked in inner.asked] == ["k-1", "k-2", None]


async def test_a_hit_never_composes_the_input_document(engine: CachingEngine, inner: CountingEngine) -> None:
    first = parts().build(Stage.AUTHZ, call())
    await engine.decide(Stage.AUTHZ, first)

    def unreadable() -> str:
        raise AssertionError("the document of a cached input was composed")

    assert (await engine.decide(Stage.AUTHZ, PolicyInput(unreadable, first.cache_key))).allow
    assert inner.asked == [first]


def test_the_generations_hold_at_most_max_entries(clock: Clock) -> None:
    kept = Generations(10, 5, clock)
    for i in range(100):
        kept.put(i, Decision(allow=True, reason=str(i)))
    assert len(kept) == 10
    assert [kept.get(i) is not None for i in (89, 90, 99)] == [False, True, True]  # the oldest went first


def test_an_entry_in_use_moves_to_the_young_generation(clock: Clock) -> None:
    kept = Generations(4, 5, clock)
    kept.put("used", Decision(allow=True))
    kept.put("unused", Decision(allow=True))
    kept.put("a", Decision(allow=True))  # "used" and "unused" are now the old generation
    assert kept.get("used") is not None  # read: moved on, with "a" now old
    kept.put("b", Decision(allow=True))
    kept.put("c", Decision(allow=True))  # the old generation ("unused") is dropped
    assert kept.get("used") is not None and kept.get("unused") is None


def test_the_generations_expire_entries_even_when_rarely_written(clock: Clock) -> None:
    kept = Generations(100, 5, clock)
    kept.put("k", Decision(allow=True))
    clock.now = 4.9
    assert kept.get("k") is not None
    clock.now = 5.0
    assert kept.get("k") is None
    kept.put("k", Decision(allow=False))
    assert kept.get("k") == Decision(allow=False)


def listing(principal: str = '{"id":"u1"}', tools: Sequence[str] = ('{"name":"a"}', '{"name":"b"}'),
            key: str = "tools-1") -> InputBatch:
    return InputBatch(Stage.AVAILABILITY, principal, tools, "2026-11-30T15:00:00Z", None, key)


async def test_a_listing_is_answered_as_a_whole_once_decided(engine: CachingEngine, inner: CountingEngine) -> None:
    assert [d.allow for d in await engine.decide_many(Stage.AVAILABILITY, listing())] == [True, True]
    inner.decision = Decision(allow=False)
    assert [d.allow for d in await engine.decide_many(Stage.AVAILABILITY, listing())] == [True, True]
    assert len(inner.asked) == 2  # the first listing's two decisions, nothing since
    await engine.decide_many(Stage.AVAILABILITY, listing(principal='{"id":"u2"}'))  # another caller: decided
    assert len(inner.asked) == 4


async def test_a_listing_lives_no_longer_than_its_oldest_decision(engine: CachingEngine, inner: CountingEngine,
                                                                 clock: Clock) -> None:
    await engine.decide(Stage.AVAILABILITY, listing()[0])  # decided at 0, expires at 5
    clock.now = 3.0
    await engine.decide_many(Stage.AVAILABILITY, listing())  # "b" decided at 3; the listing kept until 5
    clock.now = 5.0
    inner.decision = Decision(allow=False)
    assert [d.allow for d in await engine.decide_many(Stage.AVAILABILITY, listing())] == [False, True]


async def test_a_listing_with_an_uncacheable_decision_is_not_kept(clock: Clock) -> None:
    inner = CountingEngine(Decision(allow=True, cacheable=False))
    engine = CachingEngine(inner, max_entries=10, ttl_seconds=5, timer=clock)
    for _ in range(2):
        await engine.decide_many(Stage.AVAILABILITY, listing())
    assert len(inner.asked) == 4


async def test_a_new_revision_decides_listings_anew(engine: CachingEngine, inner: CountingEngine) -> None:
    await engine.decide_many(Stage.AVAILABILITY, listing())
    inner.revision, inner.decision = "sha256:two", Decision(allow=False)
    assert [d.allow for d in await engine.decide_many(Stage.AVAILABILITY, listing())] == [False, False]


def test_a_listings_inputs_are_those_of_its_tools() -> None:
    batch = listing()
    assert len(batch) == 2 and [json.loads(one.json)["tool"] for one in batch] == [{"name": "a"}, {"name": "b"}]
    assert [one.cache_key for one in batch[0:2]] == [parts(tool=t).build(Stage.AVAILABILITY).cache_key
                                                       for t in ('{"name":"a"}', '{"name":"b"}')]


async def test_whether_the_key_is_read_is_learnt_once_per_revision(engine: CachingEngine,
                                                                   inner: CountingEngine) -> None:
    """It is a fact of a policy set: asked again only when the revision changes (a reload)."""
    inner.reads_idempotency_key = True  # not a reload: the set in force still reads no key
    for key in ("k-1", "k-2"):
        await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, call(key=key)))
    inner.revision = "sha256:two"
    for key in ("k-1", "k-2"):
        await engine.decide(Stage.AUTHZ, parts().build(Stage.AUTHZ, call(key=key)))
    assert [json.loads(asked.json)["call"]["idempotency_key"] for asked in inner.asked] == ["k-1", "k-1", "k-2"]
