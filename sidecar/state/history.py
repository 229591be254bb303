"""The history of calls that policies read: metered calls, the labels a conversation's results carried, and
earlier failures of a call (table ``toolbooth_history``, migrations 0010 and 0011).

Events are grouped by scope, a hashed key (``history_scope``): a meter's, whose calls it counts together, or a
conversation's. A metered call is reserved before it is decided (``HistoryLog.reserve``): its meters are counted
and its own events added, and its conversation read, in one transaction holding the named locks of its meters'
scopes (``scope_lock``), so that concurrent calls of one scope, in every process sharing the database, are counted
one after the other; a call that does not run gives its places back (``release``). Labels and failures are
recorded after a call (``record``) and read by the conversation's next calls (``conversation``). Old events are
deleted by time (``expire``, run by ``sidecar.state.expiry.Expiry``).

A meter counts the ``CALL`` events of its scope in its window: one covering index range (scope, kind, time), so a
count costs one index entry per counted call, none for anything else. The calls of one idempotency key (a write
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

from sidecar.state.driver import Dialect, Driver

__all__ = ["Conversation", "EventKind", "HistoryEvent", "HistoryLog", "MeterCount", "Place", "Reserved",
           "history_scope", "scope_lock"]

_COLUMNS = "scope, at, kind, name, tool, detail, amount, request_id"


class EventKind(StrEnum):
    """What a history event is."""

    CALL = "call"  # a metered call, counted by a meter (possibly still being decided)
    RETRY = "retry"  # a metered call of a key that already holds a counted place: counted as that one
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


def history_scope(*parts: str) -> str:
    """A scope key: 32 hex digits of the SHA-256 of ``parts`` as a compact JSON list (fixed size, no PII in the
    index)."""
    return hashlib.sha256(json.dumps(list(parts), separators=(",", ":")).encode()).hexdigest()[:32]


def scope_lock(scope: str) -> int:
    """The named lock of ``scope`` (what ``Driver.transaction(lock=)`` takes): a signed 64-bit key from its first
    16 hex digits."""
    return int.from_bytes(bytes.fromhex(scope[:16]), "big", signed=True)


@dataclass(frozen=True, slots=True)
class _Statements:
    """The history's SQL in one dialect."""

    count: str  # a scope's counted calls after a time but one key's: how many, their sum, the oldest
    insert: str
    place: str  # insert a keyed call's event: a RETRY when its key holds a counted place after a time, else a CALL
    promote: str  # the oldest RETRY of the key of a scope's CALL (at a time, for a request) becomes a CALL
    release: str  # the event of a scope's call at a time for a request
    conversation: str  # a scope's labels and one call's failures after a time, newest first, at most a limit
    expire: str


@functools.cache
def _statements(d: Dialect) -> _Statements:
    """The statements spelled for ``d``."""
    call, retry, label, failure = (f"'{kind}'" for kind in (EventKind.CALL, EventKind.RETRY, EventKind.LABEL,
                                                            EventKind.FAILURE))
    keyed = f"name <> '' AND kind IN ({call}, {retry})"  # the terms of the partial index toolbooth_history_key
    return _Statements(
        count=d.sql("SELECT count(*), coalesce(sum(amount), 0), min(at) FROM toolbooth_history "
                    f"WHERE scope = ? AND kind = {call} AND at > ? AND (name = '' OR name <> ?)"),
        insert=d.sql(f"INSERT INTO toolbooth_history ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
        place=d.sql(f"INSERT INTO toolbooth_history ({_COLUMNS}) SELECT ?, ?, CASE WHEN EXISTS (SELECT 1 FROM "
                    f"toolbooth_history WHERE name = ? AND scope = ? AND {keyed} AND kind = {call} AND at > ?) "
                    f"THEN {retry} ELSE {call} END, ?, ?, '', ?, ?"),
        promote=d.sql(f"UPDATE toolbooth_history SET kind = {call} WHERE id = (SELECT id FROM toolbooth_history "
                      f"WHERE name = (SELECT name FROM toolbooth_history WHERE scope = ? AND kind = {call} "
                      "AND at = ? AND request_id = ? AND name <> '') "
                      f"AND scope = ? AND {keyed} AND kind = {retry} ORDER BY at, id LIMIT 1)"),
        release=d.sql(f"DELETE FROM toolbooth_history WHERE scope = ? AND kind IN ({call}, {retry}) AND at = ? "
                      "AND request_id = ?"),
        conversation=d.sql("SELECT kind, name, tool, detail, at FROM toolbooth_history WHERE scope = ? AND at > ? "
                           f"AND (kind = {label} OR (kind = {failure} AND name = ?)) "
                           "ORDER BY at DESC, id DESC LIMIT ?"),
        expire=d.sql("DELETE FROM toolbooth_history WHERE at < ?"),
    )


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
        sql = _statements(driver.dialect)
        async with driver.transaction(lock=sorted({scope_lock(place.scope) for place in places})) as tx:
            counted = []
            for place in places:
                counted.append(await tx.later(sql.count, (place.scope, place.since, place.key)))
                if place.key:
                    await tx.later(sql.place, (place.scope, now, place.key, place.scope, place.since, place.key,
                                               tool, place.amount, request_id))
                else:
                    await tx.later(sql.insert, (place.scope, now, EventKind.CALL.value, "", tool, "", place.amount,
                                                request_id))
            read = None if conversation is None else await tx.later(sql.conversation, _read(conversation))
        return Reserved([_count(deferred.rows) for deferred in counted], [] if read is None else _events(read.rows))

    async def release(self, scopes: Sequence[str], *, at: float, request_id: str) -> None:
        """Delete the events ``reserve`` added at ``at`` for ``request_id`` on ``scopes``, in one transaction holding
        their locks: a call that did not run does not consume its meters (none there: nothing to do). Where one
        was its key's counted place, the oldest retry of the key takes it."""
        if not scopes:
            return
        driver = self._driver()
        sql = _statements(driver.dialect)
        async with driver.transaction(lock=sorted({scope_lock(scope) for scope in scopes})) as tx:
            for scope in scopes:
                await tx.later(sql.promote, (scope, at, request_id, scope))
                await tx.later(sql.release, (scope, at, request_id))

    async def conversation(self, read: Conversation) -> list[HistoryEvent]:
        """The ``LABEL`` events of a conversation after ``read.since`` and its ``FAILURE`` events of the call
        ``read.call_hash``, oldest first (by ``at``, then as written), at most ``read.limit``: the newest, when there
        are more."""
        driver = self._driver()
        return _events(await driver.read(_statements(driver.dialect).conversation, _read(read)))

    async def record(self, scope: str, events: Sequence[HistoryEvent], *, request_id: str) -> None:
        """Add ``events`` (labels and failures) to ``scope`` in one transaction, durable on return."""
        if any(event.kind in (EventKind.CALL, EventKind.RETRY) for event in events):
            raise ValueError("CALL events are added by reserve, not recorded")
        if not events:
            return
        driver = self._driver()
        rows = [(scope, e.at, e.kind.value, e.name, e.tool, e.detail, 0.0, request_id) for e in events]
        async with driver.transaction(lock=None) as tx:
            await tx.execute_many(_statements(driver.dialect).insert, rows)

    async def expire(self, before: float) -> int:
        """Delete every event before ``before`` (epoch seconds); how many."""
        driver = self._driver()
        return await driver.execute(_statements(driver.dialect).expire, (before,))


def _read(conversation: Conversation) -> tuple[str, float, str, int]:
    return conversation.scope, conversation.since, conversation.call_hash, conversation.limit


def _count(rows: Sequence[Sequence[Any]]) -> MeterCount:
    [(count, total, oldest)] = rows
    return MeterCount(int(count), float(total), None if oldest is None else float(oldest))


def _events(rows: Sequence[Sequence[Any]]) -> list[HistoryEvent]:
    """Rows of the conversation query (newest first) as events, oldest first."""
    return [HistoryEvent(EventKind(kind), name, tool, detail, float(at)) for kind, name, tool, detail, at in
            reversed(rows)]
