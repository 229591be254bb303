"""The PostgreSQL driver: psycopg 3, async, autocommit; on a pool of connections or on one.

Each single statement runs in autocommit mode on a connection of its own, a session's statements on one
connection; a transaction takes the
transaction-scoped advisory lock it names (``pg_advisory_xact_lock``), so holders in every process
sharing the database wait for each other. Every psycopg error (server down, pool timeout, read-only,
lock timeout) becomes ``StoreUnavailableError``; messages show the server as ``redact_dsn`` does,
never a password.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from sidecar.errors import StoreUnavailableError
from sidecar.state.driver import Dialect, Params, Row, StatementRunner, Transaction

__all__ = ["POSTGRES", "PostgresDriver", "reason"]

POSTGRES = Dialect(
    name="postgres",
    placeholder="%s",
    now="now()",  # the server's clock, at the start of the statement's transaction
    epoch="extract(epoch FROM {})::float8",
    timestamp="to_timestamp({})",
    table_exists="SELECT to_regclass(?) IS NOT NULL",  # on the search path, as every statement sees it
    version_table="CREATE TABLE toolbooth_schema (version integer PRIMARY KEY, name text NOT NULL, "
                  "applied_at timestamptz NOT NULL DEFAULT now())",
)

Pool = AsyncConnectionPool[AsyncConnection[Any]]


def reason(exc: psycopg.Error) -> str:
    """The error's class and its message on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class _Session:
    """Statements on one connection (a ``Transaction`` while one is open on it)."""

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await (await self.conn.execute(sql, params)).fetchall()

    async def execute(self, sql: str, params: Params = ()) -> int:
        return (await self.conn.execute(sql, params)).rowcount

    async def execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        async with self.conn.cursor() as cursor:
            await cursor.executemany(sql, rows)

    async def execute_script(self, script: str) -> None:
        await self.conn.execute(script)  # without parameters, many statements may go at once


class PostgresDriver:
    """A PostgreSQL database, reached through ``source``: a pool (closed with the driver) or one connection
    (its owner closes it). ``where`` names the server in messages (``redact_dsn``)."""

    dialect = POSTGRES

    def __init__(self, source: Pool | AsyncConnection[Any], where: str) -> None:
        self._source, self._where = source, where

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """The rows of ``sql``, run on its own."""
        async with self._session() as session:
            return await session.fetch(sql, params)

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run ``sql`` on its own (committed on return); the number of rows it changed."""
        async with self._session() as session:
            return await session.execute(sql, params)

    def session(self) -> AbstractAsyncContextManager[StatementRunner]:
        """Autocommit statements on one connection; other sidecars' writes may come between them."""
        return self._session()

    @asynccontextmanager
    async def transaction(self, *, lock: int) -> AsyncIterator[Transaction]:
        """A transaction holding the advisory lock ``lock`` until it ends."""
        async with self._session() as session, session.conn.transaction():
            await session.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            yield session

    async def aclose(self) -> None:
        """Close the pool (a single connection is its owner's to close)."""
        if isinstance(self._source, AsyncConnectionPool):
            await self._source.close()

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[_Session]:
        """A connection; psycopg errors (the pool's included) become ``StoreUnavailableError``."""
        try:
            if isinstance(self._source, AsyncConnectionPool):
                async with self._source.connection() as conn:
                    yield _Session(conn)
            else:
                yield _Session(self._source)
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"PostgreSQL store at {self._where}: {reason(exc)}") from exc
