"""The local journal: store writes that must not be lost, kept on local disk until the store takes them.

A call's outcome (its result under its key, or the release of a key whose call had no effect) and audit
events are written to the store. When such a write still fails after its bounded retries, it is appended
here, durable on return (a SQLite file of its own, ``synchronous=FULL``, never the store's database), and
applied to the store later, in order (``sidecar.state.lasting``). An entry is removed only once the store
has taken it, so a crash between the two applies it again: a completion or release touches only the record
its own request still holds without a result, so it applies once; audit rows are appended again (the same
event twice, never a gap in the chain). One process uses a journal file at a time: another sidecar of the
same database on the same host uses a spare beside it, and the writes a spare holds when no process uses it
are moved into the journal of the next sidecar that opens one.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import StoreUnavailableError
from sidecar.state.chain import EVENT_COLUMNS, LATER_COLUMNS
from sidecar.state.driver import Row
from sidecar.state.records import KeyScope

__all__ = ["AuditRows", "Completion", "Journal", "JournalEntry", "Release", "Write"]


@dataclass(frozen=True, slots=True)
class Completion:
    """The result of the call ``request_id`` under its key."""

    scope: KeyScope
    request_id: str
    result_json: str


@dataclass(frozen=True, slots=True)
class Release:
    """The release of the key claimed by the call ``request_id``, which certainly had no effect."""

    scope: KeyScope
    request_id: str


@dataclass(frozen=True, slots=True)
class AuditRows:
    """Audit events (rows of ``EVENT_COLUMNS``), appended to the chain in this order."""

    rows: tuple[Row, ...]


Write = Completion | Release | AuditRows


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A kept write and its place in the journal."""

    ident: int
    write: Write


_SCHEMA = ("CREATE TABLE IF NOT EXISTS pending (id INTEGER PRIMARY KEY AUTOINCREMENT, outcome INTEGER NOT NULL, "
           "entry TEXT NOT NULL); CREATE INDEX IF NOT EXISTS pending_by_kind ON pending (outcome, id); "
           "CREATE TABLE IF NOT EXISTS owner (id INTEGER PRIMARY KEY CHECK (id = 1), store TEXT NOT NULL)")


class Journal:
    """The journal file at ``path``: append, read in order, forget. One thread uses its connection; one
    process uses the file (an exclusive lock on ``<path>.lock``)."""

    def __init__(self, path: Path, db: sqlite3.Connection, lock: int, *, spare: bool) -> None:
        self.path, self._db, self._lock, self._spare = path, db, lock, spare
        size, outcomes, newest = db.execute("SELECT COUNT(*), COALESCE(SUM(outcome), 0), COALESCE(MAX(id), 0) "
                                            "FROM pending").fetchone()
        self._size, self._outcomes, self._newest = int(size), int(outcomes), int(newest)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolbooth-journal")

    @classmethod
    def open(cls, path: Path, store: str) -> Journal:
        """Open (creating it and its directory if needed) the journal at ``path`` of the store ``store`` (its
        identity). If another process uses it (another sidecar of the same database on this host), the first
        free of ``<path>.1`` … ``<path>.16`` is used instead; the writes of a spare no process uses are moved
        into this one, so they are applied too. ``StoreUnavailableError`` naming the file if it cannot be
        opened or written, or if it holds writes of another store (they are never applied to this one)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            place, lock = _free_place(path)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot open the local journal at {path}: {exc}") from exc
        try:
            db = _connected(place, store)
            for other in _places(path):
                if other != place and other.exists():
                    _adopt(db, other, store)
        except BaseException:
            os.close(lock)
            raise
        return cls(place, db, lock, spare=place != path)

    @staticmethod
    def check(path: Path, store: str) -> None:
        """If the journal at ``path`` exists, raise what ``open`` would (it cannot be read, or holds writes of
        another store), reading it only."""
        if not path.exists():
            return
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                _refuse_another_store(db, path, store)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"cannot open the local journal at {path}: {exc}") from exc

    @property
    def size(self) -> int:
        """How many writes are kept (known without reading the file)."""
        return self._size

    @property
    def newest(self) -> int:
        """The place of the last write kept so far (0: none yet)."""
        return self._newest

    @property
    def outcomes(self) -> int:
        """How many of them are outcomes (completions and releases), not audit rows."""
        return self._outcomes

    async def keep(self, write: Write) -> None:
        """Append ``write``; durable on return (``StoreUnavailableError`` if the file cannot take it)."""
        entry, outcome = json.dumps(_encoded(write), separators=(",", ":")), _is_outcome(write)
        kept = await self._run(lambda: self._db.execute("INSERT INTO pending (outcome, entry) VALUES (?, ?)",
                                                        (outcome, entry)))
        self._newest = int(kept.lastrowid)
        self._size += 1
        self._outcomes += outcome

    async def entries(self, *, outcomes: bool | None = None, after: int = 0, until: int | None = None,
                      limit: int = -1) -> list[JournalEntry]:
        """The kept writes after the entry ``after`` and up to ``until`` (at most ``limit``; -1: all), oldest first:
        of one kind when ``outcomes`` is given (outcomes, or audit rows), read through the index of that kind."""
        kind = "" if outcomes is None else f"outcome = {int(outcomes)} AND "
        query = f"SELECT id, entry FROM pending WHERE {kind}id > ? AND id <= ? ORDER BY id LIMIT ?"
        last = self._newest if until is None else until
        rows = await self._run(lambda: self._db.execute(query, (after, last, limit)).fetchall())
        return [JournalEntry(int(ident), _decoded(json.loads(entry))) for ident, entry in rows]

    async def forget(self, *entries: JournalEntry) -> None:
        """Remove ``entries`` (in one transaction): the store has taken them."""
        kinds = ([entry.ident for entry in entries if not _is_outcome(entry.write)],
                 [entry.ident for entry in entries if _is_outcome(entry.write)])
        rows, outcomes = await self._run(lambda: self._deleted(*kinds))
        self._size -= rows + outcomes
        self._outcomes -= outcomes

    def _deleted(self, rows: list[int], outcomes: list[int]) -> tuple[int, int]:
        """How many of the audit entries ``rows`` and of the outcomes ``outcomes`` were removed (the thread's)."""
        with _transaction(self._db):
            return self._delete(rows), self._delete(outcomes)

    def _delete(self, ids: list[int]) -> int:
        if not ids:
            return 0
        return int(self._db.execute(f"DELETE FROM pending WHERE id IN ({', '.join('?' * len(ids))})", ids).rowcount)

    def close(self) -> None:
        """Close the file (what is kept stays for the next start; an empty spare is removed)."""
        self._thread.shutdown(wait=True)
        self._db.close()
        if self._spare and self._size == 0:
            self.path.unlink(missing_ok=True)  # while locked: the lock file itself stays, so no two share one
        os.close(self._lock)

    async def _run(self, fn: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn)
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailableError(f"the local journal at {self.path} cannot be written: {exc}") from exc


SPARES = 16


def _places(path: Path) -> list[Path]:
    return [path, *(path.with_name(f"{path.name}.{n}") for n in range(1, SPARES + 1))]


def _locked(place: Path) -> int | None:
    """The descriptor of an exclusive lock on ``<place>.lock``, ``None`` if another process holds it."""
    fd = os.open(f"{place}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _free_place(path: Path) -> tuple[Path, int]:
    for place in _places(path):
        if (lock := _locked(place)) is not None:
            return place, lock
    raise StoreUnavailableError(f"the local journal at {path} and its {SPARES} spares are all in use by other "
                                "processes")


def _connected(place: Path, store: str) -> sqlite3.Connection:
    """The journal database at ``place``, made if new, checked to belong to ``store``, now marked as its."""
    try:
        db = sqlite3.connect(place, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot open the local journal at {place}: {exc}") from exc
    try:
        db.execute("PRAGMA synchronous = FULL")
        db.executescript(_SCHEMA)
        _refuse_another_store(db, place, store)
        db.execute("INSERT OR REPLACE INTO owner (id, store) VALUES (1, ?)", (store,))
    except sqlite3.Error as exc:
        db.close()
        raise StoreUnavailableError(f"cannot open the local journal at {place}: {exc}") from exc
    except BaseException:
        db.close()
        raise
    return db


def _adopt(db: sqlite3.Connection, other: Path, store: str) -> None:
    """Move the writes of the spare journal ``other``, unless a process uses it, into ``db`` (one transaction
    over both files), and remove it."""
    lock = _locked(other)
    if lock is None:
        return
    try:
        with contextlib.closing(_connected(other, store)):
            pass  # it exists with its tables, and belongs to this store
        db.execute("ATTACH DATABASE ? AS other", (str(other),))
        try:
            with _transaction(db):
                db.execute("INSERT INTO main.pending (outcome, entry) SELECT outcome, entry FROM other.pending "
                           "ORDER BY id")
                db.execute("DELETE FROM other.pending")
        finally:
            db.execute("DETACH DATABASE other")
        other.unlink()
    except sqlite3.Error as exc:
        raise StoreUnavailableError(f"cannot move the writes of the local journal at {other}: {exc}") from exc
    finally:
        os.close(lock)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction on ``db`` (a connection in autocommit mode): committed, or rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _refuse_another_store(db: sqlite3.Connection, path: Path, store: str) -> None:
    """``StoreUnavailableError`` if the journal ``db`` holds writes of a store other than ``store``."""
    if not db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'owner'").fetchone()[0]:
        return  # created by nothing: an empty file
    owner = db.execute("SELECT store FROM owner").fetchone()
    (size,) = db.execute("SELECT COUNT(*) FROM pending").fetchone()
    if owner is not None and owner[0] != store and size:
        raise StoreUnavailableError(f"the local journal at {path} holds {size} write(s) of another store "
                                    f"({owner[0]}), not of {store}: start with that store to apply them, "
                                    "or set store.journal_file to another file")


def _is_outcome(write: Write) -> int:
    return 0 if isinstance(write, AuditRows) else 1


def _encoded(write: Write) -> dict[str, Any]:
    match write:
        case Completion(scope, request_id, result_json):
            return {"kind": "completion", "scope": _scope(scope), "request_id": request_id, "result": result_json}
        case Release(scope, request_id):
            return {"kind": "release", "scope": _scope(scope), "request_id": request_id}
        case AuditRows(rows):
            return {"kind": "audit", "rows": [list(row) for row in rows]}


def _decoded(entry: dict[str, Any]) -> Write:
    kind = entry["kind"]
    if kind == "completion":
        return Completion(KeyScope(*entry["scope"]), entry["request_id"], entry["result"])
    if kind == "release":
        return Release(KeyScope(*entry["scope"]), entry["request_id"])
    return AuditRows(tuple(_with_later_columns(row) for row in entry["rows"]))


def _with_later_columns(row: list[Any]) -> Row:
    """A kept audit row; one kept by a release before ``LATER_COLUMNS`` gets them, unset."""
    later = len(LATER_COLUMNS)
    return (*row, *[None] * later) if len(row) == len(EVENT_COLUMNS) - later else tuple(row)


def _scope(scope: KeyScope) -> list[str]:
    return [scope.tenant, scope.principal_id, scope.tool, scope.key]
