"""Meter tallies against a model, on SQLite and on PostgreSQL: whatever the order of reservations (windows moving
forward and back, clocks out of step), releases (promoting retries of a key) and expiries, every count a reservation
sees is the one a full count of the window gives."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from sidecar.state import MeterCount, Place, history_scope
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import AnyStore

stores, store = contract.stores, contract.store  # the contract suite's fixtures: every backend
SCOPES = [history_scope("meter", str(n)) for n in range(2)]
KEYS = ["", history_scope("key", "1"), history_scope("key", "2")]


@dataclass
class Event:
    scope: str
    at: float
    kind: str
    key: str
    amount: float
    request_id: str


class Model:
    """What the history holds and each count should be, computed from every event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def reserve(self, place: Place, now: float, request_id: str) -> MeterCount:
        window = [e for e in self.events if e.scope == place.scope and e.kind == "call" and e.at > place.since]
        own = [e for e in window if place.key and e.key == place.key]
        others = [e for e in window if e not in own]
        self.events.append(Event(place.scope, now, "retry" if own else "call", place.key, place.amount, request_id))
        return MeterCount(len(others), sum(e.amount for e in others), min((e.at for e in others), default=None))

    def release(self, scope: str, at: float, request_id: str) -> None:
        [event] = [e for e in self.events if (e.scope, e.at, e.request_id) == (scope, at, request_id)]
        if event.kind == "call" and event.key:
            takers = [e for e in self.events if e.scope == scope and e.key == event.key and e.kind == "retry"]
            if takers:
                min(takers, key=lambda e: e.at).kind = "call"  # the first written among equal times
        self.events.remove(event)

    def expire(self, before: float) -> int:
        kept = [e for e in self.events if e.at >= before]
        deleted, self.events = len(self.events) - len(kept), kept
        return deleted


@pytest.mark.parametrize("seed", range(3))
async def test_every_count_is_the_windows_whatever_came_before(store: AnyStore, seed: int) -> None:
    rng, model, log = random.Random(seed), Model(), store.history
    now, held = 1000.0, []
    for step in range(400):
        now += rng.choice([0.0, 1.0, 1.0, 2.0, 5.0, -3.0])  # sometimes a sidecar whose clock is behind
        action = rng.random()
        if action < 0.65:
            place = Place(rng.choice(SCOPES), now - rng.choice([4.0, 10.0, 30.0, 90.0]), float(rng.randint(0, 3)),
                          rng.choice(KEYS))
            request_id = f"r-{step}"
            [counted] = (await log.reserve([place], now=now, tool="t", request_id=request_id)).counts
            assert counted == model.reserve(place, now, request_id), (seed, step)
            held.append((place.scope, now, request_id))
        elif action < 0.95 and held:
            scope, at, request_id = held.pop(rng.randrange(len(held)))
            await log.release([scope], at=at, request_id=request_id)
            model.release(scope, at, request_id)
        else:
            before = now - rng.choice([20.0, 60.0])
            assert await log.expire(before) == model.expire(before), (seed, step)
            held = [place for place in held if place[1] >= before]
