"""The history of calls that policies read: metered calls, the labels a conversation's results carried, and
earlier failures of a call (table ``toolbooth_history``, migration 0010).

Events are grouped by scope, a hashed key (``history_scope``): a meter's, whose calls it counts together, or a
conversation's. A metered call is reserved before it is decided (``HistoryLog.reserve``): its meters are counted
and its own event added in one transaction holding the scope's named lock (``scope_lock``), so that concurrent
calls of one scope, in every process sharing the database, are counted one after the other; a call that does
not run gives its reservation back (``release``). Labels and failures are recorded after a call
(``record``) and read by the conversation's next calls (``conversation``). Old events are deleted by time
(``expire``, run by ``sidecar.state.expiry.Expiry``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sidecar.state.driver import Dialect, Driver

__all__ = ["EventKind", "HistoryEvent", "HistoryLog", "MeterCount", "history_scope", "scope_lock"]

_COLUMNS = "scope, at, kind, name, tool, detail, amount, request_id"


class EventKind(StrEnum):
    """What a history event is."""

    CALL = "call"  # a metered call, counted by a meter (possibly still being decided)
    LABEL = "label"  # a label a conversation's result carried
    FAILURE = "failure"  # an earlier failure of a call


@dataclass(frozen=True, slots=True)
class MeterCount:
    """What a meter counted before a call: the reservations of its scope in the window, the call's own not."""

    count: int
    total: float  # the sum of their amounts
    oldest: float | None  # ``at`` of the oldest of them (epoch seconds); ``None`` when there are none


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

    count: str  # a scope's calls after a time but one key's (a key's events one call): how many, their sum, oldest
    insert: str
    release: str  # the CALL event of a scope at a time for a request
    conversation: str  # a scope's labels and one call's failures after a time, newest first, at most a limit
    expire: str


@functools.cache
def _statements(d: Dialect) -> _Statements:
    """The statements spelled for ``d``."""
    call, label, failure = f"'{EventKind.CALL}'", f"'{EventKind.LABEL}'", f"'{EventKind.FAILURE}'"
    return _Statements(
        count=d.sql("SELECT count(*), coalesce(sum(amount), 0), min(at) FROM ("
                    f"SELECT amount, at FROM toolbooth_history WHERE scope = ? AND kind = {call} AND at > ? "
                    "AND name = '' UNION ALL SELECT max(amount), min(at) FROM toolbooth_history "
                    f"WHERE scope = ? AND kind = {call} AND at > ? AND name <> '' AND name <> ? GROUP BY name"
                    ") AS counted"),
        insert=d.sql(f"INSERT INTO toolbooth_history ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
        release=d.sql(f"DELETE FROM toolbooth_history WHERE scope = ? AND kind = {call} AND at = ? "
                      "AND request_id = ?"),
        conversation=d.sql("SELECT kind, name, tool, detail, at FROM toolbooth_history WHERE scope = ? AND at > ? "
                           f"AND (kind = {label} OR (kind = {failure} AND name = ?)) "
                           "ORDER BY at DESC, id DESC LIMIT ?"),
        expire=d.sql("DELETE FROM toolbooth_history WHERE at < ?"),
    )


class HistoryLog:
    """The history events of a store, over its driver."""

    def __init__(self, driver: Callable[[], Driver]) -> None:
        self._driver = driver  # called at each use: ``SqlStore.observe`` replaces the store's driver

    async def reserve(self, scope: str, *, now: float, since: float, amount: float, tool: str,
                      request_id: str, key: str = "") -> MeterCount:
        """Count the ``CALL`` events of ``scope`` after ``since`` and add this call's (at ``now``, adding
        ``amount``), in one transaction holding ``scope_lock(scope)``: of any number of concurrent reservers, in
        any process sharing the database, each sees a distinct count (the first 0, the next 1, ...). The events of
        one ``key`` (a write's idempotency key, as ``history_scope`` names it; ``""``: none) count as one call (its
        largest amount, from its first event), and a call of that key does not count it: a write and its retries,
        which run at most once, are one call, counted while any of them holds its event."""
        driver = self._driver()
        sql = _statements(driver.dialect)
        async with driver.transaction(lock=scope_lock(scope)) as tx:
            [(count, total, oldest)] = await tx.fetch(sql.count, (scope, since, scope, since, key))
            await tx.later(sql.insert, (scope, now, EventKind.CALL.value, key, tool, "", amount, request_id))
        return MeterCount(int(count), float(total), None if oldest is None else float(oldest))

    async def release(self, scope: str, *, at: float, request_id: str) -> None:
        """Delete the ``CALL`` event ``reserve`` added for ``request_id`` at ``at``: a call that did not run does
        not consume its meters (none there: nothing to do)."""
        driver = self._driver()
        await driver.execute(_statements(driver.dialect).release, (scope, at, request_id))

    async def conversation(self, scope: str, *, since: float, call_hash: str, limit: int) -> list[HistoryEvent]:
        """The ``LABEL`` events of ``scope`` after ``since`` and its ``FAILURE`` events of the call ``call_hash``,
        oldest first (by ``at``, then as written), at most ``limit``: the newest, when there are more."""
        driver = self._driver()
        rows = await driver.fetch(_statements(driver.dialect).conversation, (scope, since, call_hash, limit))
        return [HistoryEvent(EventKind(kind), name, tool, detail, float(at))
                for kind, name, tool, detail, at in reversed(rows)]

    async def record(self, scope: str, events: Sequence[HistoryEvent], *, request_id: str) -> None:
        """Add ``events`` (labels and failures) to ``scope`` in one transaction, durable on return."""
        if any(event.kind is EventKind.CALL for event in events):
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
