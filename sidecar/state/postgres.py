"""PostgreSQL store: many sidecars share one database (psycopg 3, async, pooled).

Statements run in autocommit mode on connections of an ``AsyncConnectionPool``. A claim
is ``INSERT ... ON CONFLICT DO NOTHING``: the primary key decides which of any number of
concurrent claimers, in any process, owns a key; the others then read the row that won.
Queued audit events are written in batches (``AuditBatcher``), one transaction per batch; it takes
the advisory lock ``AUDIT_LOCK``, reads the last hash and links the batch to it, so sidecars sharing the
database append to one linear chain (``chain.chained``).
Every psycopg error (server down, pool timeout, read-only, lock timeout) becomes
``StoreUnavailableError``; messages show the server as ``redact_dsn`` does, never a password.
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import astuple
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

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
from sidecar.state.dsn import redact_dsn
from sidecar.state.idempotency import OperationMethods, operation_sql
from sidecar.state.postgres_migrations import migrate
from sidecar.state.postgres_previews import PostgresPreviews

_KEY_WHERE = "tenant = %s AND principal_id = %s AND tool = %s AND key = %s"
_CLAIM = ("INSERT INTO idempotency (tenant, principal_id, tool, key, request_hash, request_id, deadline_at) "
          "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING true")
_READ_CLAIM = f"SELECT request_hash, result_json, deadline_at FROM idempotency WHERE {_KEY_WHERE}"
# Only a record still without a result: an operator's resolution is never overwritten or deleted.
_COMPLETE = f"UPDATE idempotency SET result_json = %s, completed_at = now() WHERE {_KEY_WHERE} AND result_json IS NULL"
_RELEASE = f"DELETE FROM idempotency WHERE {_KEY_WHERE} AND result_json IS NULL"
_INSERT_AUDIT = insert_audit_sql("%s")
_SET_MASK_KEY = "INSERT INTO audit_mask_key (id, key) VALUES (1, %s) ON CONFLICT DO NOTHING"
# pg_advisory_xact_lock key serializing audit appends: "tb-audit" in ASCII.
AUDIT_LOCK = int.from_bytes(b"tb-audit", "big")
# The row an INSERT conflicted with can be released before the SELECT reads it; then the claim starts over.
# Each new start means another claim won meanwhile; a key churned this often fails as unavailable (retryable).
_CLAIM_ATTEMPTS = 10


class PostgresStore(PostgresPreviews, OperationMethods, AuditMethods):
    """The ``Store`` for many replicas: a PostgreSQL database."""

    _OPERATION_SQL = operation_sql("%s", epoch="extract(epoch FROM {})::float8", from_epoch="to_timestamp({})")

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[Any]], where: str) -> None:
        self._pool = pool
        self._where = where
        self._audit = AuditBatcher(self._write_audit)

    @classmethod
    async def open(cls, dsn: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 5.0,
                   lock_timeout_ms: int = 5000) -> PostgresStore:
        """Migrate the schema of the database at ``dsn``, then open a pool of connections to it."""
        where = redact_dsn(dsn)
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, math.ceil(connect_timeout))}
        try:
            async with await AsyncConnection.connect(dsn, **kwargs) as conn:
                await migrate(conn)
            pool = await _open_pool(dsn, kwargs, min_size=min_size, max_size=max_size, timeout=connect_timeout,
                                    lock_timeout_ms=lock_timeout_ms)
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot open the PostgreSQL store at {where}: {_reason(exc)}") from exc
        return cls(pool, where)

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str, *,
                    deadline_at: float | None = None) -> Claim:
        row_values = (*astuple(scope), request_hash, request_id, deadline_at)
        async with self._connection() as conn:
            for _ in range(_CLAIM_ATTEMPTS):
                if await (await conn.execute(_CLAIM, row_values)).fetchone():
                    return Claim(ClaimState.CLAIMED)
                row = await (await conn.execute(_READ_CLAIM, astuple(scope))).fetchone()
                if row is not None:
                    return existing_claim(*row, request_hash)
        raise StoreUnavailableError(f"idempotency key {scope.key!r} was released {_CLAIM_ATTEMPTS} times "
                                    "while being claimed")

    async def complete(self, scope: KeyScope, result_json: str) -> None:
        async with self._connection() as conn:
            await conn.execute(_COMPLETE, (result_json, *astuple(scope)))

    async def release(self, scope: KeyScope) -> None:
        async with self._connection() as conn:
            await conn.execute(_RELEASE, astuple(scope))

    async def audit_records(self, *, after_id: int = 0, limit: int | None = None,
                            newest_first: bool = False) -> list[AuditRecord]:
        sql = select_audit_sql("%s", newest_first=newest_first)
        async with self._connection() as conn:
            rows = await (await conn.execute(sql, (after_id, limit))).fetchall()  # type: ignore[arg-type]
        return [audit_record(row) for row in rows]

    async def audit_mask_key(self, candidate: bytes) -> bytes:
        async with self._connection() as conn:
            await conn.execute(_SET_MASK_KEY, (candidate.hex(),))
            row = await (await conn.execute("SELECT key FROM audit_mask_key")).fetchone()
        assert row is not None  # inserted just before, if missing
        return bytes.fromhex(row[0])

    async def aclose(self) -> None:
        await self.flush_audit()
        await self._pool.close()

    async def _write_audit(self, rows: list[Row]) -> None:
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK,))
            last = await (await conn.execute(LAST_AUDIT_HASH)).fetchone()
            async with conn.cursor() as cursor:
                await cursor.executemany(_INSERT_AUDIT, chained(last[0] if last else None, rows))

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection; psycopg errors (the pool's included) become ``StoreUnavailableError``."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"PostgreSQL store at {self._where}: {_reason(exc)}") from exc


async def _open_pool(dsn: str, kwargs: dict[str, Any], *, min_size: int, max_size: int, timeout: float,
                     lock_timeout_ms: int) -> AsyncConnectionPool[AsyncConnection[Any]]:
    """A pool with ``min_size`` connections ready; ``timeout`` also bounds the wait for a free connection."""
    pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
        dsn, kwargs=kwargs, min_size=min_size, max_size=max_size, timeout=timeout, open=False, name="toolbooth",
        configure=functools.partial(_configure, lock_timeout_ms=lock_timeout_ms))
    try:
        await pool.open(wait=True, timeout=timeout)
    except BaseException:
        await pool.close()
        raise
    return pool


async def _configure(conn: AsyncConnection[Any], *, lock_timeout_ms: int) -> None:
    """Bound lock waits of each new connection, as SQLite's busy timeout does."""
    await conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{lock_timeout_ms}ms",))


def _reason(exc: psycopg.Error) -> str:
    """The error's class and its message on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
