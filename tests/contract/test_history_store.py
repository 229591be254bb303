"""The history part of the ``Store`` contract, on SQLite and on PostgreSQL (fixtures of ``test_store_contract``):
meters counted one reserver after the other, in one store and across two sharing a database, conversations read
back in order, events kept across a restart and expired by time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from sidecar.errors import StoreUnavailableError
from sidecar.state import Conversation, EventKind, Expiry, HistoryEvent, HistoryLog, MeterCount, Place, history_scope
from sidecar.state.history import scope_lock
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import AnyStore, PostgresBackend, Stores

stores, store = contract.stores, contract.store  # the contract suite's fixtures: every backend
METER = history_scope("writes", "acme", "dev-1")
CONVERSATION = history_scope("conversation", "acme", "c-1")
CALL_HASH, OTHER_HASH = "sha256:" + "a" * 64, "sha256:" + "b" * 64


async def reserve(log: HistoryLog, at: float, *, scope: str = METER, since: float = 0.0, amount: float = 1.0,
                  request_id: str = "r") -> MeterCount:
    [counted] = (await log.reserve([Place(scope, since, amount)], now=at, tool="send_email",
                                   request_id=request_id)).counts
    return counted


async def release(log: HistoryLog, scope: str, *, at: float, request_id: str) -> None:
    await log.release([scope], at=at, request_id=request_id)


def conversation(scope: str = CONVERSATION, *, since: float = 0.0, call_hash: str = CALL_HASH,
                 limit: int = 10) -> Conversation:
    return Conversation(scope, since, call_hash, limit)


def label(name: str, at: float) -> HistoryEvent:
    return HistoryEvent(EventKind.LABEL, name, "read_file", "", at)


def failure(call_hash: str, at: float, code: str = "TIMEOUT") -> HistoryEvent:
    return HistoryEvent(EventKind.FAILURE, call_hash, "send_email", code, at)


async def counts(logs: list[HistoryLog], each: int) -> list[int]:
    """The counts ``each`` concurrent reservations through every log in ``logs`` see, sorted."""
    seen = await asyncio.gather(*(reserve(log, time.time(), request_id=f"r-{n}-{i}")
                                  for n, log in enumerate(logs) for i in range(each)))
    assert all(meter.total == meter.count for meter in seen)  # each reservation adds 1
    return sorted(meter.count for meter in seen)


def test_a_scope_is_a_fixed_size_key_and_names_a_signed_64_bit_lock() -> None:
    assert len(METER) == 32 and int(METER, 16) >= 0
    assert history_scope("a", "b") != history_scope("a,b") != history_scope("ab")
    assert history_scope("a", "b") == history_scope("a", "b")
    assert {scope_lock("8" + "0" * 31), scope_lock("7" + "f" * 31)} == {-(2 ** 63), 2 ** 63 - 1}


async def test_reserve_counts_the_calls_of_its_scope_after_since(store: AnyStore) -> None:
    log = store.history
    assert await reserve(log, 100.0, amount=2.0) == MeterCount(0, 0.0, None)
    assert await reserve(log, 110.0, amount=3.5) == MeterCount(1, 2.0, 100.0)
    assert await reserve(log, 115.0, scope=history_scope("writes", "acme", "dev-2"), amount=10.0) == MeterCount(
        0, 0.0, None)  # another scope's
    await log.record(METER, [label("pii", 116.0)], request_id="r-label")  # not a call
    assert await reserve(log, 120.0, since=100.0, amount=0.5) == MeterCount(1, 3.5, 110.0)  # at == since: not after
    assert await reserve(log, 130.0, amount=0.0) == MeterCount(3, 6.0, 100.0)


async def test_concurrent_reservers_each_see_a_distinct_count(store: AnyStore) -> None:
    assert await counts([store.history], 64) == list(range(64))


async def test_reservers_of_two_stores_sharing_a_database_each_see_a_distinct_count(stores: Stores) -> None:
    """Two sidecars (on PostgreSQL, two pools of connections): the scope's lock is the database's."""
    first, second = await stores.open(), await stores.open()
    assert await counts([first.history, second.history], 32) == list(range(64))


async def test_release_gives_back_only_that_requests_reservation(store: AnyStore) -> None:
    log = store.history
    await reserve(log, 100.0, request_id="r1")
    await reserve(log, 110.0, request_id="r2")
    await log.record(METER, [label("pii", 100.0)], request_id="r1")
    await release(log, METER, at=110.0, request_id="r1")  # r1 reserved at 100, not 110
    await release(log, METER, at=100.0, request_id="unknown")
    await release(log, history_scope("other"), at=100.0, request_id="r1")
    assert await reserve(log, 120.0, request_id="r3") == MeterCount(2, 2.0, 100.0)
    await release(log, METER, at=100.0, request_id="r1")
    assert await reserve(log, 130.0, request_id="r4") == MeterCount(2, 2.0, 110.0)  # r2 and r3
    assert await log.conversation(conversation(METER)) == [label("pii", 100.0)]


async def test_a_conversation_is_its_labels_and_one_calls_failures_oldest_first(store: AnyStore) -> None:
    log = store.history
    await log.record(CONVERSATION, [label("pii", 10.0), label("secret", 20.0), failure(CALL_HASH, 30.0)],
                     request_id="r1")
    await log.record(CONVERSATION, [failure(OTHER_HASH, 35.0)], request_id="r2")
    await log.record(CONVERSATION, [label("pii", 40.0), failure(CALL_HASH, 40.0, "UNAVAILABLE")], request_id="r3")
    await log.record(history_scope("conversation", "acme", "c-2"), [label("other", 45.0)], request_id="r4")
    await reserve(log, 50.0, scope=CONVERSATION)  # a call, not a label

    async def read(since: float, limit: int = 10) -> list[HistoryEvent]:
        return await log.conversation(conversation(since=since, limit=limit))

    newest = [label("secret", 20.0), failure(CALL_HASH, 30.0), label("pii", 40.0),
              failure(CALL_HASH, 40.0, "UNAVAILABLE")]
    assert await read(15.0) == newest
    assert await read(0.0) == [label("pii", 10.0), *newest]
    assert await read(20.0) == newest[1:]  # at == since: not after
    assert await read(0.0, limit=3) == newest[1:]
    assert await read(0.0, limit=1) == newest[-1:]
    assert await log.conversation(conversation(call_hash=OTHER_HASH)) == [
        label("pii", 10.0), label("secret", 20.0), failure(OTHER_HASH, 35.0), label("pii", 40.0)]


async def test_recorded_events_read_back_whole_and_outlast_a_restart(stores: Stores) -> None:
    now = time.time()
    events = [HistoryEvent(EventKind.LABEL, "données·personnelles", "lire_fichier", "", now - 0.123456),
              HistoryEvent(EventKind.FAILURE, CALL_HASH, "send_email", "UPSTREAM_TIMEOUT", now)]
    first = await stores.open()
    await first.history.record(CONVERSATION, [], request_id="r0")  # nothing
    await first.history.record(CONVERSATION, events, request_id="r1")
    await reserve(first.history, now, amount=2.25, request_id="r2")
    assert await first.history.conversation(conversation()) == events
    await stores.close(first)
    second = await stores.open()
    assert await second.history.conversation(conversation()) == events
    assert await reserve(second.history, now + 1, request_id="r3") == MeterCount(1, 2.25, now)


async def test_a_call_event_is_reserved_not_recorded(store: AnyStore) -> None:
    with pytest.raises(ValueError, match="reserve"):
        await store.history.record(METER, [HistoryEvent(EventKind.CALL, "", "t", "", 1.0)], request_id="r")


async def test_expire_deletes_only_older_events(store: AnyStore) -> None:
    log = store.history
    for at in (10.0, 20.0, 30.0):
        await reserve(log, at, request_id=f"r-{at}")
        await log.record(CONVERSATION, [label(f"l-{at}", at)], request_id=f"r-{at}")
    assert await log.expire(20.0) == 2  # the call and the label at 10
    assert await log.expire(20.0) == 0
    assert await reserve(log, 40.0) == MeterCount(2, 2.0, 20.0)
    assert await log.conversation(conversation()) == [
        label("l-20.0", 20.0), label("l-30.0", 30.0)]


async def test_the_background_expiry_deletes_history_past_its_retention(store: AnyStore,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "toolbooth.store")
    now = time.time()
    await reserve(store.history, now - 7200, request_id="old")
    await reserve(store.history, now, request_id="new")
    expiry = Expiry(store.history.expire, 3600, what="history event", aged="recorded")
    expiry.poke()
    await expiry.aclose()  # waits for the cleanup it started
    assert "deleted 1 history event(s) recorded over 1 hours ago" in caplog.text
    assert await reserve(store.history, now + 1) == MeterCount(1, 1.0, now)


@contextmanager
def holding(stores: Stores, scope: str) -> Iterator[None]:
    """Another connection holds the lock of ``scope``: on PostgreSQL that one, on SQLite the file's."""
    if not isinstance(stores.backend, PostgresBackend):
        with stores.backend.locked():
            yield
        return
    with psycopg.connect(stores.backend.dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (scope_lock(scope),))
        yield


async def test_a_reserver_that_cannot_take_its_scopes_lock_in_time_is_unavailable(stores: Stores) -> None:
    store = await stores.open(lock_timeout_ms=50)
    with holding(stores, METER):
        with pytest.raises(StoreUnavailableError):
            await reserve(store.history, 100.0)
        if isinstance(stores.backend, PostgresBackend):  # another scope's lock is another
            assert await reserve(store.history, 100.0, scope=CONVERSATION) == MeterCount(0, 0.0, None)
    assert await reserve(store.history, 110.0) == MeterCount(0, 0.0, None)  # the failed one counted nothing


async def test_a_store_whose_history_is_gone_is_unavailable(stores: Stores) -> None:
    store = await stores.open()
    stores.backend.execute("DROP TABLE toolbooth_history")  # by someone with database access
    log = store.history
    with pytest.raises(StoreUnavailableError):
        await reserve(log, 100.0)
    with pytest.raises(StoreUnavailableError):
        await release(log, METER, at=100.0, request_id="r")
    with pytest.raises(StoreUnavailableError):
        await log.conversation(conversation())
    with pytest.raises(StoreUnavailableError):
        await log.record(CONVERSATION, [label("pii", 100.0)], request_id="r")
    with pytest.raises(StoreUnavailableError):
        await log.expire(100.0)


async def test_calls_of_one_key_count_as_one_while_any_of_them_holds_its_place(store: AnyStore) -> None:
    log, key = store.history, history_scope("key", "acme", "dev-1", "send_email", "k-1")

    async def keyed(at: float, request_id: str, amount: float = 1.0) -> MeterCount:
        [counted] = (await log.reserve([Place(METER, 0.0, amount, key)], now=at, tool="send_email",
                                       request_id=request_id)).counts
        return counted

    assert await keyed(100.0, "a") == MeterCount(0, 0.0, None)
    assert await keyed(101.0, "b", 3.0) == MeterCount(0, 0.0, None)  # its own key's calls are not others
    assert await reserve(log, 102.0, request_id="c") == MeterCount(1, 1.0, 100.0)  # the key once, at its first
    await release(log, METER, at=100.0, request_id="a")  # the first did not run: the retry takes the key's place
    assert await reserve(log, 103.0, request_id="d") == MeterCount(2, 4.0, 101.0)
    await release(log, METER, at=101.0, request_id="b")  # neither ran: the key is no longer counted
    assert await reserve(log, 104.0, request_id="e") == MeterCount(2, 2.0, 102.0)
    assert await keyed(105.0, "f") == MeterCount(3, 3.0, 102.0)  # the key again: counted anew
    await release(log, METER, at=103.0, request_id="d")  # not keyed: no retry takes its place
    assert await reserve(log, 106.0, request_id="g") == MeterCount(3, 3.0, 102.0)


async def test_a_key_whose_counted_call_left_the_window_is_counted_again(store: AnyStore) -> None:
    log, key = store.history, history_scope("key", "acme", "dev-1", "send_email", "k-1")
    for at, request_id in ((100.0, "a"), (150.0, "b")):
        await log.reserve([Place(METER, at - 30.0, 1.0, key)], now=at, tool="send_email", request_id=request_id)
    assert await reserve(log, 160.0, since=130.0, request_id="c") == MeterCount(1, 1.0, 150.0)


async def test_one_reservation_counts_every_meter_and_reads_the_conversation(store: AnyStore) -> None:
    log, other = store.history, history_scope("writes", "acme")
    await log.record(CONVERSATION, [label("pii", 90.0), failure(CALL_HASH, 95.0)], request_id="r0")
    await reserve(log, 95.0, scope=other, amount=5.0, request_id="r0")
    reserved = await log.reserve([Place(METER, 0.0, 1.0), Place(other, 0.0, 2.0)], now=100.0, tool="send_email",
                                 request_id="r1", conversation=conversation())
    assert reserved.counts == [MeterCount(0, 0.0, None), MeterCount(1, 5.0, 95.0)]
    assert reserved.events == [label("pii", 90.0), failure(CALL_HASH, 95.0)]
    assert (await log.reserve([], now=101.0, tool="t", request_id="r2", conversation=conversation())).events == (
        reserved.events)  # no meter: the conversation alone
    await log.release([METER, other], at=100.0, request_id="r1")
    assert await reserve(log, 110.0, scope=other, request_id="r3") == MeterCount(1, 5.0, 95.0)
    assert await reserve(log, 110.0, request_id="r3") == MeterCount(0, 0.0, None)
