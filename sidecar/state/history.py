"""The history of calls that policies read: metered calls, the labels a conversation's results carried, and
earlier failures of a call (tables ``toolbooth_history`` and ``toolbooth_history_meters``, migrations 0010-0012;
the SQL is in ``sidecar.state.history_sql``).

Events are grouped by scope, a hashed key (``history_scope``): a meter's, whose calls it counts together, or a
conversation's. A metered call is reserved before it is decided (``HistoryLog.reserve``): its meters are counted
and its own events added, and its conversation read, in one transaction holding the named locks of its meters'
scopes (``scope_lock``), so that concurrent calls of one scope, in every process sharing the database, are counted
one after the other; a call that does not run gives its places back (``release``). Labels and failures are
recorded after a call (``record``) and read by the conversation's next calls (``conversation``). Old events are
deleted by time (``expire``, run by ``sidecar.state.expiry.Expiry``).

A meter counts the ``CALL`` events of its scope in its window from a tally of the scope, moved along with the
window: a count reads the events that left the window since the scope's last call (about one per call), not the
window. The calls of one idempotency key (a write
and its retries, which run at most once) count as one: a call whose key already holds a counted place in the
window is added as a ``RETRY`` event, which no meter counts; when the counted one is given back, the oldest
``RETRY`` of its key takes its place.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.state.driver import Deferred, Driver, Transaction
from sidecar.state.history_sql import CALL, RETRY, HistoryStatements, statements

__all__ = ["Conversation", "EventKind", "HistoryEvent", "HistoryLog", "MeterCount", "Place", "Reserved",
           "history_scope", "scope_lock"]

class EventKind(StrEnum):
    """What a history event is."""

    CALL = CALL  # a metered call, counted by a meter (possibly still being decided)
    RETRY = RETRY  # a metered call of a key that already holds a counted place: counted as that one
    LABEL = "label"  # a label a conversation's result carried
    FAILURE = "failure"  # an earlier failure of a call


@dataclass(frozen=True, slots=True)
class MeterCount:
    """What a meter counted before a call: the reservations of its scope in the window, the call's own not."""

    count: int
    total: float  # the sum of their amounts
    oldest: float | None  # ``at`` of the oldest of them (epoch seconds); ``None`` when there are none


@dataclass(frozen=True, slots=True)
class Place:
    """A call's place to reserve on one meter: its scope, the start of its window (exclusive), what the call adds
    to its sum, and the call's idempotency key as ``history_scope`` names it (``""``: none)."""

    scope: str
    since: float
    amount: float = 0.0
    key: str = ""


@dataclass(frozen=True, slots=True)
class Conversation:
    """What of a conversation to read: the labels of ``scope`` after ``since`` and the failures of the call
    ``call_hash``, at most ``limit`` (the newest)."""

    scope: str
    since: float
    call_hash: str
    limit: int


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """A label or a failure of a conversation (``CALL`` events are written by ``HistoryLog.reserve`` only)."""

    kind: EventKind
    name: str  # the label, or the failed call's hash
    tool: str
    detail: str  # a failure's error code, "" for a label
    at: float  # epoch seconds


@functools.lru_cache(maxsize=4096)
def history_scope(*parts: str) -> str:
    """A scope key: 32 hex digits of the SHA-256 of ``parts`` as a compact JSON list (fixed size, no PII in the
    index). Every call computes its conversation's: the keys of recent ones are kept."""
    return hashlib.sha256(json.dumps(list(parts), separators=(",", ":")).encode()).hexdigest()[:32]


def scope_lock(scope: str) -> int:
    """The named lock of ``scope`` (what ``Driver.transaction(lock=)`` takes): a signed 64-bit key from its first
    16 hex digits."""
    return int.from_bytes(bytes.fromhex(scope[:16]), "big", signed=True)


@dataclass(frozen=True, slots=True)
class Reserved:
    """What ``HistoryLog.reserve`` read: each place's meter count, in order, and the conversation's events."""

    counts: list[MeterCount]
    events: list[HistoryEvent]


class HistoryLog:
    """The history events of a store, over its driver."""

    def __init__(self, driver: Callable[[], Driver]) -> None:
        self._driver = driver  # called at each use: ``SqlStore.observe`` replaces the store's driver

    async def reserve(self, places: Sequence[Place], *, now: float, tool: str, request_id: str,
                      conversation: Conversation | None = None) -> Reserved:
        """Count the ``CALL`` events of each place's scope after its ``since`` and add this call's (at ``now``), and
        read ``conversation``, in one transaction holding every place's ``scope_lock``: of any number of concurrent
        reservers, in any process sharing the database, each sees a distinct count on each meter (the first 0, the
        next 1, ...). A call of a key that holds a counted place does not count that place, and takes none of its
        own (``RETRY``): a write and its retries, which run at most once, are one call."""
        if not places:
            return Reserved([], [] if conversation is None else await self.conversation(conversation))
        driver = self._driver()
        sql = statements(driver.dialect)
        async with driver.transaction(lock=sorted({scope_lock(place.scope) for place in places})) as tx:
            tallies = [await self._place(tx, sql, place, now, tool, request_id) for place in places]
            read = None if conversation is None else await tx.later(sql.conversation, _read(conversation))
        return Reserved([_count(deferred.rows) for deferred in tallies], [] if read is None else _events(read.rows))

    @staticmethod
    async def _place(tx: Transaction, sql: HistoryStatements, place: Place, now: float, tool: str,
                     request_id: str) -> Deferred:
        """Bring the scope's tally to the place's window, read it, and add the call's event (counted in the tally
        unless its key holds a counted place)."""
        scope, since, key = place.scope, place.since, place.key
        await tx.later(sql.start, (scope, since, scope, since, scope, since, scope))
        await tx.later(sql.leave, (since, since, since, scope, since))
        await tx.later(sql.come_back, (since, since, since, scope, since))
        tallied = await tx.later(sql.tallied, (scope, scope, since, scope, scope, since, scope, since, key,
                                               key, scope, since, key, scope, since))
        await tx.later(sql.add, (place.amount, scope, now, key, scope, since))
        if key:
            await tx.later(sql.place, (scope, now, key, scope, since, key, tool, place.amount, request_id))
        else:
            await tx.later(sql.insert, (scope, now, CALL, "", tool, "", place.amount, request_id))
        return tallied

    async def release(self, scopes: Sequence[str], *, at: float, request_id: str) -> None:
        """Delete the events ``reserve`` added at ``at`` for ``request_id`` on ``scopes``, in one transaction holding
        their locks: a call that did not run does not consume its meters (none there: nothing to do). Where one
        was its key's counted place, the oldest retry of the key takes it."""
        if not scopes:
            return
        driver = self._driver()
        sql = statements(driver.dialect)
        async with driver.transaction(lock=sorted({scope_lock(scope) for scope in scopes})) as tx:
            for scope in scopes:
                released, taker = (scope, at, request_id), (scope, at, request_id, scope)
                await tx.later(sql.drop, (*released, scope, at, *released))
                await tx.later(sql.promoted, (*taker, scope, *taker))
                await tx.later(sql.promote, taker)
                await tx.later(sql.release, released)

    async def conversation(self, read: Conversation) -> list[HistoryEvent]:
        """The ``LABEL`` events of a conversation after ``read.since`` and its ``FAILURE`` events of the call
        ``read.call_hash``, oldest first (by ``at``, then as written), at most ``read.limit``: the newest, when there
        are more."""
        driver = self._driver()
        return _events(await driver.read(statements(driver.dialect).conversation, _read(read)))

    async def record(self, scope: str, events: Sequence[HistoryEvent], *, request_id: str) -> None:
        """Add ``events`` (labels and failures) to ``scope`` in one transaction, durable on return."""
        if any(event.kind in (EventKind.CALL, EventKind.RETRY) for event in events):
            raise ValueError("CALL events are added by reserve, not recorded")
        if not events:
            return
        driver = self._driver()
        rows = [(scope, e.at, e.kind.value, e.name, e.tool, e.detail, 0.0, request_id) for e in events]
        async with driver.transaction(lock=None) as tx:
            await tx.execute_many(statements(driver.dialect).insert, rows)

    async def expire(self, before: float) -> int:
        """Delete every event before ``before`` (epoch seconds), and the meter tallies starting before it, in one
        transaction (a tally kept counts no event deleted); how many events."""
        driver = self._driver()
        sql = statements(driver.dialect)
        async with driver.transaction(lock=None) as tx:
            await tx.later(sql.expire_tallies, (before,))
            deleted = await tx.later(sql.expire, (before,))
        return deleted.changed


def _read(conversation: Conversation) -> tuple[str, float, str, int]:
    return conversation.scope, conversation.since, conversation.call_hash, conversation.limit


def _count(rows: Sequence[Sequence[Any]]) -> MeterCount:
    """A tally as ``tallied`` reads it, the calls of the reserving call's own key taken off."""
    [(calls, total, oldest, key_calls, key_total)] = rows
    return MeterCount(int(calls) - int(key_calls), float(total) - float(key_total),
                      None if oldest is None else float(oldest))


def _events(rows: Sequence[Sequence[Any]]) -> list[HistoryEvent]:
    """Rows of the conversation query (newest first) as events, oldest first."""
    return [HistoryEvent(EventKind(kind), name, tool, detail, float(at)) for kind, name, tool, detail, at in
            reversed(rows)]
