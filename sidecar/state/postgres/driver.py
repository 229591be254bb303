"""The PostgreSQL driver: psycopg 3, async, autocommit; on a pool of connections or on one.

Each single statement runs in autocommit mode on a connection of its own, a session's statements on one
connection; a transaction takes the
transaction-scoped advisory lock it names (``pg_advisory_xact_lock``), so holders in every process
sharing the database wait for each other. Every psycopg error (server down, pool timeout, read-only,
lock timeout) becomes ``StoreUnavailableError`` (``StoreRefusedError`` when the data itself is refused);
messages show the server as ``redact_dsn`` does,
never a password.

A server that does not answer a statement within ``answer_timeout`` seconds (a silent network
partition: no error, no reset, nothing) gets that connection severed (``shutdown`` of its socket), so
the statement fails at once as ``StoreUnavailableError`` and the pool replaces the connection. Cancelling
the waiting task instead would make psycopg spend up to ten more seconds trying to cancel the query over
the same dead network.

A database that cannot be reached (a connection lost, or none to be had within the pool's wait) makes the
driver *down*: until a statement succeeds again, a call waits at most ``down_wait`` seconds for a pooled
connection (one the pool opened meanwhile, or the first one back) before it fails, instead of the pool's
full wait each, so calls during an outage fail fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from sidecar.errors import StoreRefusedError, StoreUnavailableError
from sidecar.state.driver import Deferred, Dialect, Locks, Params, Row, StatementRunner, Transaction

__all__ = ["POSTGRES", "PostgresDriver", "reason"]

POSTGRES = Dialect(
    name="postgres",
    placeholder="%s",
    now="now()",  # the server's clock, at the start of the statement's transaction
    epoch="extract(epoch FROM {})::float8",
    timestamp="to_timestamp({})",
    insert_new="INSERT INTO {} ON CONFLICT DO NOTHING",
    returning="{} RETURNING {}",
    table_exists="SELECT to_regclass(?) IS NOT NULL",  # on the search path, as every statement sees it
    version_table="CREATE TABLE toolbooth_schema (version integer PRIMARY KEY, name text NOT NULL, "
                  "applied_at timestamptz NOT NULL DEFAULT now())",
    single_writer=False,
)

Pool = AsyncConnectionPool[AsyncConnection[Any]]
T = TypeVar("T")


def reason(exc: psycopg.Error) -> str:
    """The error's class and its message on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class _Session:
    """Statements on one connection (a ``Transaction`` while one is open on it), each answered within
    ``answer_timeout`` seconds or its connection severed."""

    def __init__(self, conn: AsyncConnection[Any], answer_timeout: float | None) -> None:
        self.conn, self._timeout, self.severed = conn, answer_timeout, False

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._answered(self._fetch(sql, params))

    async def execute(self, sql: str, params: Params = ()) -> int:
        return await self._answered(self._execute(sql, params))

    async def later(self, sql: str, params: Params = ()) -> Deferred:
        cursor = await self._answered(self.conn.execute(sql, params))
        return Deferred(await cursor.fetchall() if cursor.description else [], cursor.rowcount)

    async def execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        await self._answered(self._execute_many(sql, rows))

    async def execute_script(self, script: str) -> None:
        await self._answered(self.conn.execute(script))  # without parameters, many statements may go at once

    async def _fetch(self, sql: str, params: Params) -> list[Row]:
        return await (await self.conn.execute(sql, params)).fetchall()

    async def _execute(self, sql: str, params: Params) -> int:
        return (await self.conn.execute(sql, params)).rowcount

    async def _execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        async with self.conn.cursor() as cursor:
            await cursor.executemany(sql, rows)

    async def _answered(self, step: Awaitable[T]) -> T:
        if self._timeout is None:
            return await step
        watchdog = asyncio.get_running_loop().call_later(self._timeout, self._sever)
        try:
            return await step
        finally:
            watchdog.cancel()

    def _sever(self) -> None:
        self.severed = True
        with contextlib.suppress(OSError):  # already closed: nothing to sever
            with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)


class PostgresDriver:
    """A PostgreSQL database, reached through ``source``: a pool (closed with the driver) or one connection
    (its owner closes it). ``where`` names the server in messages (``redact_dsn``)."""

    dialect = POSTGRES

    def __init__(self, source: Pool | AsyncConnection[Any], where: str, *, answer_timeout: float | None = None,
                 down_wait: float | None = None) -> None:
        self._source, self._where, self._timeout, self._down_wait = source, where, answer_timeout, down_wait
        self._down = False  # the database could not be reached, and no statement succeeded since

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """The rows of ``sql``, run on its own."""
        async with self._session() as session:
            return await session.fetch(sql, params)

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        """As ``fetch``: a query is a round trip on the event loop already."""
        return await self.fetch(sql, params)

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run ``sql`` on its own (committed on return); the number of rows it changed."""
        async with self._session() as session:
            return await session.execute(sql, params)

    def session(self) -> AbstractAsyncContextManager[StatementRunner]:
        """Autocommit statements on one connection; other sidecars' writes may come between them."""
        return self._session()

    @asynccontextmanager
    async def transaction(self, *, lock: Locks) -> AsyncIterator[Transaction]:
        """A transaction holding the advisory lock ``lock`` (or each of several, in order; if any) until it ends."""
        async with self._session() as session:  # BEGIN and COMMIT are statements too: each answered in time
            await session.execute("BEGIN")
            try:
                for key in () if lock is None else (lock,) if isinstance(lock, int) else lock:
                    await session.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                yield session
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # a connection that failed is discarded anyway
                    await session.execute("ROLLBACK")
                raise
            await session.execute("COMMIT")

    async def aclose(self) -> None:
        """Close the pool (a single connection is its owner's to close), waiting for its background work (e.g. a
        connection being opened to a server that does not answer) at most ``answer_timeout`` seconds."""
        if isinstance(self._source, AsyncConnectionPool):
            await self._source.close(timeout=self._timeout or 5.0)

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[_Session]:
        """A connection; psycopg errors (the pool's included) become ``StoreUnavailableError``."""
        session: _Session | None = None
        try:
            if isinstance(self._source, AsyncConnectionPool):
                async with self._source.connection(timeout=self._down_wait if self._down else None) as conn:
                    session = _Session(conn, self._timeout)
                    yield session
            else:
                session = _Session(self._source, self._timeout)
                yield session
        except psycopg.Error as exc:
            if isinstance(exc, PoolTimeout) or (session is not None and (session.severed or session.conn.broken)):
                self._down = True
            if session is not None and session.severed:
                raise StoreUnavailableError(f"PostgreSQL store at {self._where}: no answer within {self._timeout} s "
                                            "(connection severed)") from exc
            if isinstance(exc, psycopg.DataError):  # the value itself: a NUL in text, a number out of range
                raise StoreRefusedError(f"PostgreSQL store at {self._where} refuses the data: {reason(exc)}") from exc
            raise StoreUnavailableError(f"PostgreSQL store at {self._where}: {reason(exc)}") from exc
        self._down = False
