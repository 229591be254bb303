"""``StoreHistory`` giving meter places back: a place the store cannot take back at once is tried again, in the
background, until it can (else a short outage would hold a meter's limit for its whole window), and a last time when
the sidecar stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.errors import CallRefused, StoreUnavailableError
from sidecar.pipeline import results
from sidecar.pipeline.stored_history import StoreHistory
from sidecar.policy.history import HistoryNeeds, Meter, MeterKey
from sidecar.state import Place
from sidecar.state.sqlite import SqliteStore
from tests.support.waiting import until
from tests.unit.test_history_decisions import called, pay

NEEDS = HistoryNeeds((Meter("calls", (MeterKey.PRINCIPAL,), 60),))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "store.db")
    yield opened
    await opened.aclose()


class Failing:
    """The store's ``release``, failing its first ``times`` calls."""

    def __init__(self, store: SqliteStore, times: int) -> None:
        self.release, self.left, self.calls = store.history.release, times, 0

    async def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise StoreUnavailableError("connection lost")
        await self.release(*args, **kwargs)


async def refused_call(history: StoreHistory) -> str:
    """Reserve a call's place on the meter, then settle it as refused (it did not run: its place goes back); the
    meter's scope."""
    call = called({}, pay)
    seen = await history.seen(call, NEEDS)
    await history.settle(call, NEEDS, seen, results.error(call, ErrorInfo.of(ErrorCode.PERMISSION_DENIED, "no")))
    return seen.reservations[0].scope


async def counted(store: SqliteStore, failing: Failing, scope: str) -> int:
    """What the meter counts before another call of the principal (reserved and given back at once)."""
    reserved = await store.history.reserve([Place(scope, 0.0)], now=10.0 ** 10, tool="pay", request_id="probe")
    await failing.release([scope], at=10.0 ** 10, request_id="probe")
    return reserved.counts[0].count


async def test_a_place_the_store_could_not_take_back_is_given_back_later(store: SqliteStore,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    failing = Failing(store, times=3)
    monkeypatch.setattr(store.history, "release", failing)
    history = StoreHistory(store, retention_seconds=3600, retry_delay=0.01)
    scope = await refused_call(history)
    assert failing.calls == 1  # the caller was answered after one try

    async def given_back() -> bool:
        return await counted(store, failing, scope) == 0

    await until(given_back, timeout=30, what="the place given back")
    assert failing.calls == 4
    await history.aclose()


async def test_a_stopping_sidecar_tries_once_more_then_stops(store: SqliteStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    failing = Failing(store, times=1000)
    monkeypatch.setattr(store.history, "release", failing)
    history = StoreHistory(store, retention_seconds=3600, retry_delay=3600)  # the next try would be in an hour
    scope = await refused_call(history)
    await asyncio.wait_for(history.aclose(), 10)  # not an hour
    assert failing.calls == 2
    assert await counted(store, failing, scope) == 1  # it stays counted until it leaves its window


async def test_a_meter_looking_back_further_than_the_history_is_kept_refuses_its_calls(store: SqliteStore) -> None:
    """The backstop for policies an OPA server changes without the sidecar loading them (a directory or bundle
    with such a meter is refused where it loads): the call is refused, nothing reserved."""
    history = StoreHistory(store, retention_seconds=30)
    with pytest.raises(CallRefused) as refused:
        await history.seen(called({}, pay), NEEDS)
    [error] = refused.value.errors
    assert error.code is ErrorCode.INTERNAL_ERROR
    assert error.message == ("meter 'calls' of the policy looks back 60 s, longer than the call history is kept "
                             "(30 s: store.history_retention_hours); shorten its window_seconds or raise "
                             "store.history_retention_hours")
    assert await store.driver.fetch("SELECT count(*) FROM toolbooth_history") == [(0,)]
    await history.aclose()
