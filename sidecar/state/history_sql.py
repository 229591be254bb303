"""The SQL of the call history (``sidecar.state.history``): tables ``toolbooth_history`` (the events) and
``toolbooth_history_meters`` (a tally per meter scope), in one dialect.

A tally holds, for one scope, the number and the sum of its ``call`` events after its ``since``. A call moves it to
its meter's window (``leave`` takes off the events that left it, ``come_back`` adds those a longer window takes back
in), reads it (``tallied``), and adds its own event (``add``): each touches the events between two windows and a
few rows by key, never the whole window. The statements keep it exact where an event is added, given back
(``drop``) or promoted from retry (``promoted``); where it is missing (new, or deleted by ``expire_tallies``),
``start`` counts it once, and ``tallied`` falls back to counting the window.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sidecar.state.driver import Dialect

__all__ = ["CALL", "COLUMNS", "RETRY", "HistoryStatements", "statements"]

COLUMNS = "scope, at, kind, name, tool, detail, amount, request_id"
CALL, RETRY, LABEL, FAILURE = "call", "retry", "label", "failure"  # the values of ``EventKind``

_EVENTS = "toolbooth_history"
_TALLY = "toolbooth_history_meters"
_KEYED = f"name <> '' AND kind IN ('{CALL}', '{RETRY}')"  # the terms of the partial index toolbooth_history_key
_KEY_CALLS = f"FROM {_EVENTS} WHERE name = ? AND scope = ? AND {_KEYED} AND kind = '{CALL}' AND at > ?"
_WINDOW = f"FROM {_EVENTS} WHERE scope = ? AND kind = '{CALL}' AND at > ?"
_RELEASED = f"scope = ? AND kind = '{CALL}' AND at = ? AND request_id = ?"  # a call's event, given back
# the retry that takes the place of the call given back: its key's oldest
_TAKER = (f"(SELECT taker.id FROM {_EVENTS} AS taker WHERE taker.name = (SELECT name FROM {_EVENTS} WHERE "
          f"{_RELEASED} AND name <> '') AND taker.scope = ? AND taker.name <> '' "
          f"AND taker.kind IN ('{CALL}', '{RETRY}') AND taker.kind = '{RETRY}' ORDER BY taker.at, taker.id LIMIT 1)")


@dataclass(frozen=True, slots=True)
class HistoryStatements:
    """The history's statements in one dialect, with ``?`` placeholders spelled for it."""

    start: str  # a scope's tally from its window, unless it has one
    leave: str  # a tally moved to a later start: the events between the two taken off
    come_back: str  # a tally moved to an earlier start: the events between the two added
    tallied: str  # a scope's tally (else its window counted), the oldest counted but a key's, a key's calls
    add: str  # a call's event counted in the tally, unless its key already holds a counted place
    insert: str  # an event
    place: str  # a keyed call's event: a RETRY when its key holds a counted place after a time, else a CALL
    drop: str  # a call given back taken off its tally
    promoted: str  # the retry that takes its place added to the tally
    promote: str  # that retry becomes a CALL
    release: str  # the event of a scope's call at a time for a request
    conversation: str  # a scope's labels and one call's failures after a time, newest first, at most a limit
    expire_tallies: str  # the tallies starting before a time
    expire: str  # the events before a time


@functools.cache
def statements(d: Dialect) -> HistoryStatements:
    """The statements spelled for ``d``."""
    moved = f"FROM {_EVENTS} AS moved WHERE moved.scope = {_TALLY}.scope AND moved.kind = '{CALL}'"
    return HistoryStatements(
        start=d.sql(f"INSERT INTO {_TALLY} (scope, since, calls, total) SELECT ?, ?, (SELECT count(*) {_WINDOW}), "
                    f"(SELECT coalesce(sum(amount), 0) {_WINDOW}) WHERE NOT EXISTS (SELECT 1 FROM {_TALLY} "
                    "WHERE scope = ?)"),
        leave=d.sql(f"UPDATE {_TALLY} SET "
                    f"calls = calls - (SELECT count(*) {moved} AND moved.at > {_TALLY}.since AND moved.at <= ?), "
                    f"total = total - (SELECT coalesce(sum(moved.amount), 0) {moved} AND moved.at > {_TALLY}.since "
                    "AND moved.at <= ?), since = ? WHERE scope = ? AND since < ?"),
        come_back=d.sql(f"UPDATE {_TALLY} SET "
                        f"calls = calls + (SELECT count(*) {moved} AND moved.at > ? AND moved.at <= {_TALLY}.since), "
                        f"total = total + (SELECT coalesce(sum(moved.amount), 0) {moved} AND moved.at > ? "
                        f"AND moved.at <= {_TALLY}.since), since = ? WHERE scope = ? AND since > ?"),
        tallied=d.sql(f"SELECT coalesce((SELECT calls FROM {_TALLY} WHERE scope = ?), (SELECT count(*) {_WINDOW})), "
                      f"coalesce((SELECT total FROM {_TALLY} WHERE scope = ?), "
                      f"(SELECT coalesce(sum(amount), 0) {_WINDOW})), "
                      f"(SELECT at {_WINDOW} AND (name = '' OR name <> ?) ORDER BY at LIMIT 1), "
                      f"(SELECT count(*) {_KEY_CALLS}), (SELECT coalesce(sum(amount), 0) {_KEY_CALLS})"),
        add=d.sql(f"UPDATE {_TALLY} SET calls = calls + 1, total = total + ? WHERE scope = ? AND since < ? "
                  f"AND NOT EXISTS (SELECT 1 {_KEY_CALLS})"),
        insert=d.sql(f"INSERT INTO {_EVENTS} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
        place=d.sql(f"INSERT INTO {_EVENTS} ({COLUMNS}) SELECT ?, ?, CASE WHEN EXISTS (SELECT 1 {_KEY_CALLS}) "
                    f"THEN '{RETRY}' ELSE '{CALL}' END, ?, ?, '', ?, ?"),
        drop=d.sql(f"UPDATE {_TALLY} SET calls = calls - 1, total = total - (SELECT amount FROM {_EVENTS} WHERE "
                   f"{_RELEASED}) WHERE scope = ? AND since < ? AND EXISTS (SELECT 1 FROM {_EVENTS} WHERE "
                   f"{_RELEASED})"),
        promoted=d.sql(f"UPDATE {_TALLY} SET calls = calls + 1, total = total + (SELECT amount FROM {_EVENTS} "
                       f"WHERE id = {_TAKER}) WHERE scope = ? AND since < (SELECT at FROM {_EVENTS} "
                       f"WHERE id = {_TAKER})"),
        promote=d.sql(f"UPDATE {_EVENTS} SET kind = '{CALL}' WHERE id = {_TAKER}"),
        release=d.sql(f"DELETE FROM {_EVENTS} WHERE scope = ? AND kind IN ('{CALL}', '{RETRY}') AND at = ? "
                      "AND request_id = ?"),
        conversation=d.sql(f"SELECT kind, name, tool, detail, at FROM {_EVENTS} WHERE scope = ? AND at > ? "
                           f"AND (kind = '{LABEL}' OR (kind = '{FAILURE}' AND name = ?)) "
                           "ORDER BY at DESC, id DESC LIMIT ?"),
        expire_tallies=d.sql(f"DELETE FROM {_TALLY} WHERE since < ?"),
        expire=d.sql(f"DELETE FROM {_EVENTS} WHERE at < ?"),
    )
