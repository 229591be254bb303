"""A decision cache in front of any ``PolicyEngine``.

Decisions are kept for a short time (``Generations``, below), keyed by the policy
revision, the stage and the input without its clock (``PolicyInput.cache_key``:
principal, tool, conversation and the call's arguments), and with the call's
``idempotency_key`` only when the policy set may read it (``reads_idempotency_key``:
its source mentions ``idempotency_key``): otherwise every keyed call would be a miss.
So a cached decision is never used across a revision change, and a policy whose
answer depends on the time or on anything outside its input marks the decision
``"cacheable": false``. Failures are never cached. The TTL bounds how stale a
time-dependent decision a policy forgot to mark can be. A listing's decisions
(``InputBatch``) are also kept as one answer, no longer than the oldest of them.

The entries live in two generations of plain dicts (``Generations``), not in a
cachetools ``TTLCache``: with distinct inputs on every call (a miss each), the
``TTLCache``'s bookkeeping on every insert cost more than the dict lookups it guards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from sidecar.policy.decision import Decision, Stage
from sidecar.policy.engine import DelegatingEngine, PolicyEngine
from sidecar.policy.input import InputBatch, PolicyInput

__all__ = ["CachingEngine", "Generations"]

V = TypeVar("V")


class Generations(Generic[V]):
    """At most ``max_entries`` values (at least two), each for at most ``ttl_seconds``: a young and an old dict.

    New entries go to the young one; when it holds half of ``max_entries``, or is ``ttl_seconds`` old, it
    becomes the old one and the old one is dropped. An entry read from the old generation moves to the young
    one (with its own expiry), so what is used stays; every read checks the entry's expiry.
    """

    def __init__(self, max_entries: int, ttl_seconds: float, timer: Callable[[], float]) -> None:
        self._half, self._ttl, self._timer = max(1, max_entries // 2), ttl_seconds, timer
        self._young: dict[Hashable, tuple[float, V]] = {}
        self._old: dict[Hashable, tuple[float, V]] = {}
        self._born = timer()

    def get(self, key: Hashable) -> V | None:
        """The value kept for ``key`` if it has not expired."""
        entry = self.entry(key)
        return None if entry is None else entry[1]

    def entry(self, key: Hashable) -> tuple[float, V] | None:
        """When the value kept for ``key`` expires (the timer's time), and the value, if it has not expired."""
        entry = self._young.get(key)
        if entry is None:
            entry = self._old.pop(key, None)
            if entry is None or entry[0] <= self._timer():
                return None
            self._add(key, entry)
        return entry if entry[0] > self._timer() else None

    def put(self, key: Hashable, value: V, expires: float | None = None) -> None:
        """Keep ``value`` for ``key`` for ``ttl_seconds`` from now, or until ``expires`` if that is sooner."""
        until = self._timer() + self._ttl
        self._add(key, (until if expires is None else min(until, expires), value))

    def clear(self) -> None:
        """Drop every entry."""
        self._young, self._old = {}, {}

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def _add(self, key: Hashable, entry: tuple[float, V]) -> None:
        if len(self._young) >= self._half or self._timer() - self._born >= self._ttl:
            self._old, self._young, self._born = self._young, {}, self._timer()
        self._young[key] = entry


class CachingEngine(DelegatingEngine):
    """``PolicyEngine`` that answers repeated inputs from a TTL cache; everything else goes to ``inner``."""

    def __init__(self, inner: PolicyEngine, *, max_entries: int, ttl_seconds: float,
                 timer: Callable[[], float] = time.monotonic) -> None:
        super().__init__(inner)
        self._cache: Generations[Decision] = Generations(max_entries, ttl_seconds, timer)
        self._batches: Generations[tuple[Decision, ...]] = Generations(max_entries, ttl_seconds, timer)
        self._revision, self._keyers = inner.revision, _keyers(inner.revision, inner.reads_idempotency_key)

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """The cached decision for ``input``, else the wrapped engine's (kept when cacheable)."""
        key = self._keyer(stage)(input)
        if key is not None and (cached := self._cache.get(key)) is not None:
            return cached
        decision = await self.inner.decide(stage, input)
        self._keep(key, decision)
        return decision

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """Cached decisions where there are some; the wrapped engine answers the rest in one batch. An
        ``InputBatch`` whose decisions were all cacheable is answered as a whole, without making its inputs."""
        key_of = self._keyer(stage)
        batch = (self._revision, stage, inputs.cache_key) if isinstance(inputs, InputBatch) else None
        if batch is not None and (kept := self._batches.get(batch)) is not None:
            return list(kept)
        decisions, expires = await self._decide_each(stage, inputs, key_of)
        if batch is not None and all(decision.cacheable for decision in decisions):
            self._batches.put(batch, tuple(decisions), expires)  # no longer than its oldest decision
        return decisions

    async def _decide_each(self, stage: Stage, inputs: Sequence[PolicyInput],
                           key_of: Callable[[PolicyInput], Hashable | None]) -> tuple[list[Decision], float | None]:
        """The decisions, and when the first of those answered from the cache expires (``None``: none was)."""
        keys = list(map(key_of, inputs))
        entries = [None if key is None else self._cache.entry(key) for key in keys]
        found = [None if entry is None else entry[1] for entry in entries]
        expires = min((entry[0] for entry in entries if entry is not None), default=None)
        missing = [i for i, decision in enumerate(found) if decision is None]
        fresh = await self.inner.decide_many(stage, [inputs[i] for i in missing]) if missing else []
        for i, decision in zip(missing, fresh, strict=True):
            found[i] = decision
            self._keep(keys[i], decision)
        return [decision for decision in found if decision is not None], expires

    def _keyer(self, stage: Stage) -> Callable[[PolicyInput], Hashable | None]:
        """The key of an input for ``stage`` under the policy set in force (asked once, for a whole batch); the
        set's rules for keys are read once per revision."""
        revision = self.inner.revision
        if revision != self._revision:  # a new policy set: drop every old decision at once
            self._cache.clear()
            self._batches.clear()
            self._revision, self._keyers = revision, _keyers(revision, self.inner.reads_idempotency_key)
        return self._keyers[stage]

    def _keep(self, key: Hashable | None, decision: Decision) -> None:
        if key is not None and decision.cacheable:
            self._cache.put(key, decision)


def _keyers(revision: str, reads_idempotency_key: bool) -> dict[Stage, Callable[[PolicyInput], Hashable | None]]:
    """Per stage, the key of an input (``None``: not cached) under one policy set: with the call's idempotency
    key only when its policies may read it."""
    def keyer(stage: Stage) -> Callable[[PolicyInput], Hashable | None]:
        if reads_idempotency_key:
            return lambda input: None if input.cache_key is None else (
                revision, stage, input.cache_key, input.idempotency_key)
        return lambda input: None if input.cache_key is None else (revision, stage, input.cache_key)

    return {stage: keyer(stage) for stage in Stage}
