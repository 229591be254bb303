"""SQLite store: one connection owned by one worker thread, WAL journal.

All statements run on a single-thread executor, so claims are serialized in this
process; ``BEGIN IMMEDIATE`` transactions keep them atomic across processes that
share the file. ``synchronous=FULL``: a claim and the audit event before a dispatch are on
disk before the handler runs, even if the machine loses power.
Queued audit events are written in batches (``AuditBatcher``), one transaction per
batch: under load many calls share one thread hop and one commit. Audit appends read
the last hash and link the batch to it (``chain.chained``) inside ``BEGIN IMMEDIATE``.
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

from sidecar.errors import StoreUnavailableError
from sidecar.state import AuditRecord, Claim, ClaimState, KeyScope
from sidecar.state.chain import chained
from sidecar.state.common import (
    LAST_AUDIT_HASH,
    AuditBatcher,
    AuditMethods,
    Row,
    audit_record,
    existing_claim,
    insert_audit_sql,
    select_audit_sql,
)
from sidecar.state.idempotency import OperationMethods, operation_sql
from sidecar.state.sqlite_previews import PREVIEW_SCHEMA, SqlitePreviews

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
CREATE TABLE IF NOT EXISTS audit_mask_key (id INTEGER PRIMARY KEY CHECK (id = 1), key TEXT NOT NULL);
"""
# Added after the first release (table, column, type): files created before get them on open.
_LATER_COLUMNS = (("audit", "arguments_json", "TEXT"), ("audit", "prev_hash", "TEXT"), ("audit", "hash", "TEXT"),
                  ("idempotency", "deadline_at", "REAL"))
_INSERT_AUDIT = insert_audit_sql("?")
_KEY_WHERE = "tenant = ? AND principal_id = ? AND tool = ? AND key = ?"


class SqliteStore(SqlitePreviews, OperationMethods, AuditMethods):
    """The default ``Store``: a local SQLite file."""

    _OPERATION_SQL = operation_sql("?", epoch="{}", from_epoch="{}")

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

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str, *,
                    deadline_at: float | None = None) -> Claim:
        return await self._run(lambda: self._claim(scope, request_hash, request_id, deadline_at))

    async def complete(self, scope: KeyScope, result_json: str) -> None:
        # Only a record still without a result: an operator's resolution is never overwritten or deleted.
        sql = f"UPDATE idempotency SET result_json = ?, completed_at = ? WHERE {_KEY_WHERE} AND result_json IS NULL"
        await self._run(lambda: self._write(sql, (result_json, time.time(), *astuple(scope))))

    async def release(self, scope: KeyScope) -> None:
        sql = f"DELETE FROM idempotency WHERE {_KEY_WHERE} AND result_json IS NULL"
        await self._run(lambda: self._write(sql, astuple(scope)))

    async def audit_records(self, *, after_id: int = 0, limit: int | None = None,
                            newest_first: bool = False) -> list[AuditRecord]:
        sql = select_audit_sql("?", newest_first=newest_first)
        rows = await self._run(lambda: self._db.execute(sql, (after_id, -1 if limit is None else limit)).fetchall())
        return [audit_record(row) for row in rows]

    async def audit_mask_key(self, candidate: bytes) -> bytes:
        return bytes.fromhex(await self._run(lambda: self._mask_key(candidate.hex())))

    async def _write_audit(self, rows: list[Row]) -> None:
        await self._run(functools.partial(self._append_audit, rows))

    async def aclose(self) -> None:
        await self.flush_audit()
        await self._run(self._db.close)
        self._executor.shutdown(wait=True)

    async def _fetch(self, sql: str, params: Row) -> list[Row]:
        return await self._run(lambda: self._db.execute(sql, params).fetchall())

    async def _execute(self, sql: str, params: Row) -> int:
        return await self._run(lambda: self._change(sql, params))

    async def _run(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"SQLite store error: {exc}") from exc

    def _write(self, sql: str, params: Row) -> None:
        with self._db:
            self._db.execute(sql, params)

    def _append_audit(self, rows: list[Row]) -> None:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            last = self._db.execute(LAST_AUDIT_HASH).fetchone()
            self._db.executemany(_INSERT_AUDIT, chained(last[0] if last else None, rows))

    def _mask_key(self, candidate: str) -> str:
        with self._db:
            self._db.execute("INSERT OR IGNORE INTO audit_mask_key (id, key) VALUES (1, ?)", (candidate,))
        return str(self._db.execute("SELECT key FROM audit_mask_key").fetchone()[0])

    def _claim(self, scope: KeyScope, request_hash: str, request_id: str, deadline_at: float | None) -> Claim:
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(f"SELECT request_hash, result_json, deadline_at FROM idempotency WHERE {_KEY_WHERE}",
                                   astuple(scope)).fetchone()
            if row is None:
                self._db.execute("INSERT INTO idempotency (tenant, principal_id, tool, key, request_hash, request_id, "
                                 "created_at, deadline_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 (*astuple(scope), request_hash, request_id, time.time(), deadline_at))
                return Claim(ClaimState.CLAIMED)
        return existing_claim(*row, request_hash)


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.executescript(_SCHEMA)
    db.executescript(PREVIEW_SCHEMA)
    for table, column, kind in _LATER_COLUMNS:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    return db
