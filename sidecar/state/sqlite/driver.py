"""The SQLite driver: one connection owned by one worker thread, WAL journal.

Every statement runs on a single-thread executor, so this process's statements are serialized;
a transaction (and a session) is ``BEGIN IMMEDIATE`` (the database's one write lock, whatever lock it
is asked for), so it is atomic across processes sharing the file, and the driver's other statements
wait until it ends. ``synchronous=FULL``: a commit is on disk on return, even if the machine then loses power.
Waits for another process's lock are bounded by the busy timeout; then the statement fails as
``StoreUnavailableError`` (``StoreRefusedError`` when the data itself is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TypeVar

from sidecar.errors import StoreRefusedError, StoreUnavailableError
from sidecar.state.driver import Deferred, Dialect, Locks, Params, Row, StatementRunner, Transaction, naming

__all__ = ["SQLITE", "SqliteDriver", "connect", "insert_many", "script_statements"]

T = TypeVar("T")

SQLITE = Dialect(
    name="sqlite",
    placeholder="?",
    now="toolbooth_now()",  # Python's clock (``time.time``), registered on each connection: microseconds
    epoch="{}",  # timestamps are stored as epoch seconds (REAL)
    timestamp="{}",
    insert_new="INSERT INTO {} ON CONFLICT DO NOTHING",
    returning="{} RETURNING {}",
    table_exists="SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?",
    version_table="CREATE TABLE toolbooth_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                  "applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
    single_writer=True,
)


def connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """A connection to ``path`` (created with its folder if missing) in autocommit mode, WAL, ``synchronous=FULL``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.create_function("toolbooth_now", 0, time.time)
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        _use_wal(db, busy_timeout_ms / 1000)
        db.execute("PRAGMA synchronous = FULL")
    except BaseException:
        db.close()
        raise
    return db


def _use_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Put the file in WAL mode (a property of the file, kept once set). Switching needs a moment alone with
    the file, and SQLite answers "database is locked" at once, without its busy handler, while another
    process is creating or migrating it: so try again until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def script_statements(script: str) -> list[str]:
    """The ``;``-terminated statements of ``script`` (comments kept with the statement after them)."""
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if any(line.strip() and not line.strip().startswith("--") for line in pending.splitlines()):
        raise ValueError(f"an SQL statement is not terminated by ';': {pending.strip()!r}")
    return statements


_VALUES = re.compile(r"\bVALUES\s*(\(\s*\?(?:\s*,\s*\?)*\s*\))\s*$", re.IGNORECASE)


def insert_many(db: sqlite3.Connection, sql: str, rows: Iterable[Params]) -> None:
    """``db.executemany(sql, rows)``, but an ``INSERT ... VALUES (?, ...)`` goes as few multi-row statements.

    ``sqlite3`` lets go of the GIL around every statement it steps, and this thread then waits to get it back;
    while the event loop is busy that wait is up to the interpreter's switch interval (5 ms), once per row
    with ``executemany``. So a batch of audit rows written row by row took seconds under load, while the calls
    queued more behind it (the queue, and the memory, grew without end). Here the rows go in chunks whose
    sizes are powers of two (few distinct statements for the statement cache), each within SQLite's limit on
    variables, in order: the rows of a chunk are inserted in the order given.
    """
    match = _VALUES.search(sql)
    if match is None:
        db.executemany(sql, rows)
        return
    group = match.group(1)
    width = group.count("?")
    largest = 1 << max(0, (db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width).bit_length() - 1)
    head, pending = sql[:match.start(1)], iter(rows)
    while chunk := list(itertools.islice(pending, largest)):
        while chunk:
            size = 1 << (len(chunk).bit_length() - 1)  # the largest power of two it holds
            part, chunk = chunk[:size], chunk[size:]
            db.execute(head + ", ".join(itertools.repeat(group, size)), list(itertools.chain.from_iterable(part)))


def _named(sql: str, step: Callable[[sqlite3.Connection], object]) -> Callable[[sqlite3.Connection], None]:
    """``step``, a deferred run of ``sql``, whose database error names ``sql``."""

    def run(db: sqlite3.Connection) -> None:
        try:
            step(db)
        except sqlite3.Error as exc:
            raise naming(exc, sql) from None

    return run


def _statement(exc: sqlite3.Error) -> str | None:
    statement = getattr(exc, "statement", None)
    return statement if isinstance(statement, str) else None


class _Worker:
    """The connection and the one thread that uses it."""

    def __init__(self, db: sqlite3.Connection, executor: ThreadPoolExecutor) -> None:
        self.db, self._executor = db, executor

    async def run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.DataError as exc:  # the value itself (e.g. an integer out of SQLite's range)
            raise naming(StoreRefusedError(f"SQLite store refuses the data: {exc}"), _statement(exc)) from exc
        except sqlite3.Error as exc:
            raise naming(StoreUnavailableError(f"SQLite store error: {exc}"), _statement(exc)) from exc

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self.run(lambda: self.db.execute(sql, params).fetchall())

    async def execute(self, sql: str, params: Params = ()) -> int:
        return await self.run(lambda: self.db.execute(sql, params).rowcount)

    def rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # the error that led here is the one to report
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class _Reader:
    """A read-only connection to the file, used on the thread that opened it (the event loop's), that never waits:
    in WAL mode a reader waits for no writer, and a read the database cannot answer at once (it is busy, or a
    statement fails) is left to the worker. Short indexed reads cost less here than a trip to the worker thread."""

    def __init__(self, path: Path | None) -> None:
        self._path, self._thread = path, 0
        self._db: sqlite3.Connection | None = None
        self._closed = path is None

    def rows(self, sql: str, params: Params) -> list[Row] | None:
        """The rows of ``sql``, or ``None`` when this thread cannot read them at once."""
        db = self._open()
        if db is None:
            return None
        try:
            return db.execute(sql, params).fetchall()
        except sqlite3.Error:
            return None

    def close(self) -> None:
        self._closed = True
        if self._db is not None and self._thread == threading.get_ident():
            self._db.close()
        self._db = None

    def _open(self) -> sqlite3.Connection | None:
        if self._db is not None:
            return self._db if self._thread == threading.get_ident() else None
        if self._closed or self._path is None:
            return None
        try:
            db = sqlite3.connect(f"{self._path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        except sqlite3.Error:
            self._closed = True  # not readable from here: every read goes to the worker
            return None
        try:
            db.execute("PRAGMA busy_timeout = 0")
            db.execute("PRAGMA query_only = 1")
        except sqlite3.Error:
            db.close()
            return None
        self._db, self._thread = db, threading.get_ident()
        return db


class _Transaction:
    """One ``BEGIN IMMEDIATE`` transaction, sent to the worker thread in as few trips as its results allow.

    Each trip through the executor costs the event loop more than a statement does, so ``BEGIN`` travels
    with the first statement whose result is needed, and writes whose result is not (``execute_many``,
    ``execute_script``) with the next such statement or with ``COMMIT``: an audit append is two trips,
    not four, and its rows (a lazy iterable: the chain's hashing) are built on the worker thread, off
    the event loop. A deferred write that fails, fails the commit, and the transaction rolls back.
    """

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._pending: list[Callable[[sqlite3.Connection], object]] = [lambda db: db.execute("BEGIN IMMEDIATE")]

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._after_pending(lambda db: db.execute(sql, params).fetchall())

    async def execute(self, sql: str, params: Params = ()) -> int:
        return await self._after_pending(lambda db: db.execute(sql, params).rowcount)

    async def later(self, sql: str, params: Params = ()) -> Deferred:
        deferred = Deferred()

        def step(db: sqlite3.Connection) -> None:
            cursor = db.execute(sql, params)
            deferred.rows, deferred.changed = cursor.fetchall(), cursor.rowcount

        self._pending.append(_named(sql, step))
        return deferred

    async def execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        self._pending.append(_named(sql, lambda db: insert_many(db, sql, rows)))

    async def execute_script(self, script: str) -> None:
        statements = script_statements(script)
        self._pending.append(lambda db: [db.execute(statement) for statement in statements])

    async def commit(self) -> None:
        await self._after_pending(lambda db: db.execute("COMMIT"))

    async def _after_pending(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        pending, self._pending, db = self._pending, [], self._worker.db

        def run() -> T:
            for step in pending:
                step(db)
            return fn(db)

        return await self._worker.run(run)


class SqliteDriver:
    """A SQLite database file, for one process's store."""

    dialect = SQLITE

    def __init__(self, worker: _Worker, path: Path | None = None) -> None:
        self._worker = worker
        self._lock = asyncio.Lock()  # held by a transaction, and by each statement outside one
        self._reader = _Reader(path)

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_ms: int = 5000) -> SqliteDriver:
        """Open (creating if needed) the database at ``path``."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolbooth-sqlite")
        try:
            db = await asyncio.get_running_loop().run_in_executor(executor, connect, path, busy_timeout_ms)
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open SQLite store at {path}: {exc}") from exc
        return cls(_Worker(db, executor), path)

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """The rows of ``sql``, run on its own."""
        async with self._lock:
            return await self._worker.fetch(sql, params)

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run ``sql`` on its own (committed on return); the number of rows it changed."""
        async with self._lock:
            return await self._worker.execute(sql, params)

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        """The rows of ``sql``, which writes nothing, from a read-only connection of the calling thread (no trip to
        the worker thread) when the database answers at once; else, or when it fails, as ``fetch`` (which waits
        within the busy timeout, and reports a failure)."""
        rows = self._reader.rows(sql, params)
        return await self.fetch(sql, params) if rows is None else rows

    def session(self) -> AbstractAsyncContextManager[StatementRunner]:
        """A ``BEGIN IMMEDIATE`` transaction: no writer, in any process, comes between its statements."""
        return self.transaction(lock=0)

    @asynccontextmanager
    async def transaction(self, *, lock: Locks) -> AsyncIterator[Transaction]:
        """A ``BEGIN IMMEDIATE`` transaction: the write lock covers every ``lock``."""
        async with self._lock:
            transaction = _Transaction(self._worker)
            try:
                yield transaction
                await transaction.commit()
            except BaseException:
                await self._worker.run(self._worker.rollback)
                raise

    async def aclose(self) -> None:
        """Close the connections and stop the thread."""
        self._reader.close()
        async with self._lock:
            await self._worker.run(self._worker.db.close)
        self._worker.shutdown()
