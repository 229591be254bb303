"""SQLite store: one connection owned by one worker thread, WAL journal.

All statements run on a single-thread executor, so claims are serialized in this
process; ``BEGIN IMMEDIATE`` transactions keep them atomic across processes that
share the file. ``synchronous=NORMAL`` in WAL mode survives a crash of the process.
Queued audit events are written in batches (``AuditBatcher``), one transaction per
batch: under load many calls share one thread hop and one commit.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple
from pathlib import Path
from typing import TypeVar

from sidecar.state import AuditEvent, Claim, ClaimState, KeyScope, StoreUnavailableError
from sidecar.state.common import AUDIT_COLUMNS, AuditBatcher, Row, audit_row, existing_claim

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    tenant TEXT NOT NULL, principal_id TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
    request_hash TEXT NOT NULL, request_id TEXT NOT NULL, result_json TEXT,
    created_at REAL NOT NULL, completed_at REAL,
    PRIMARY KEY (tenant, principal_id, tool, key)
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, time TEXT NOT NULL,
    principal_id TEXT NOT NULL, tenant TEXT NOT NULL, tool TEXT NOT NULL, tool_version TEXT NOT NULL,
    input_hash TEXT NOT NULL, decisions_json TEXT NOT NULL,
    policy_revision TEXT NOT NULL, idempotency_key TEXT, call_id TEXT, conversation_id TEXT,
    status TEXT NOT NULL, error_code TEXT, duration_ms INTEGER NOT NULL
);
"""
_INSERT_AUDIT = (f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(AUDIT_COLUMNS))})")
_KEY_WHERE = "tenant = ? AND principal_id = ? AND tool = ? AND key = ?"


class SqliteStore:
    """The default ``Store``: a local SQLite file."""

    def __init__(self, connection: sqlite3.Connection, executor: ThreadPoolExecutor) -> None:
        self._db = connection
        self._executor = executor
        self._audit = AuditBatcher(self._write_audit)

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_ms: int = 5000) -> SqliteStore:
        """Open (creating if needed) the database at ``path``."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolbooth-sqlite")
        loop = asyncio.get_running_loop()
        try:
            db = await loop.run_in_executor(executor, _connect, path, busy_timeout_ms)
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open SQLite store at {path}: {exc}") from exc
        return cls(db, executor)

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str) -> Claim:
        return await self._run(lambda: self._claim(scope, request_hash, request_id))

    async def complete(self, scope: KeyScope, result_json: str) -> None:
        sql = f"UPDATE idempotency SET result_json = ?, completed_at = ? WHERE {_KEY_WHERE}"
        await self._run(lambda: self._write(sql, (result_json, time.time(), *astuple(scope))))

    async def release(self, scope: KeyScope) -> None:
        await self._run(lambda: self._write(f"DELETE FROM idempotency WHERE {_KEY_WHERE}", astuple(scope)))

    async def record_audit(self, event: AuditEvent) -> None:
        await self._run(lambda: self._write(_INSERT_AUDIT, audit_row(event)))

    def queue_audit(self, event: AuditEvent) -> None:
        self._audit.put(event)

    async def flush_audit(self) -> None:
        await self._audit.flush()

    async def audit_events(self) -> list[AuditEvent]:
        """Every audit event (queued ones included), oldest first."""
        await self.flush_audit()
        sql = f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit ORDER BY id"
        rows = await self._run(lambda: self._db.execute(sql).fetchall())
        return [AuditEvent(*row) for row in rows]

    async def _write_audit(self, rows: list[Row]) -> None:
        await self._run(functools.partial(self._write_many, _INSERT_AUDIT, rows))

    async def aclose(self) -> None:
        await self.flush_audit()
        await self._run(self._db.close)
        self._executor.shutdown(wait=True)

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"SQLite store error: {exc}") from exc

    def _write(self, sql: str, params: Row) -> None:
        with self._db:
            self._db.execute(sql, params)

    def _write_many(self, sql: str, rows: list[Row]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(sql, rows)

    def _claim(self, scope: KeyScope, request_hash: str, request_id: str) -> Claim:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(f"SELECT request_hash, result_json FROM idempotency WHERE {_KEY_WHERE}",
                                   astuple(scope)).fetchone()
            if row is None:
                self._db.execute("INSERT INTO idempotency (tenant, principal_id, tool, key, request_hash, request_id, "
                                 "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (*astuple(scope), request_hash, request_id, time.time()))
                return Claim(ClaimState.CLAIMED)
        return existing_claim(*row, request_hash)


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.executescript(_SCHEMA)
    return db
