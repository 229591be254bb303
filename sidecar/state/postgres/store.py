"""The PostgreSQL store, for many replicas: ``SqlStore`` on a shared database (``store.postgres_dsn``)."""

from __future__ import annotations

import functools
import math
from typing import Any

import psycopg
from psycopg import AsyncConnection

from sidecar.config.dsn import redact_dsn
from sidecar.errors import StoreUnavailableError
from sidecar.state.migrate import migrate
from sidecar.state.postgres.driver import Pool, PostgresDriver, reason
from sidecar.state.sql_store import SqlStore

__all__ = ["PostgresStore", "reach"]


class PostgresStore(SqlStore):
    """``SqlStore`` over a pooled ``PostgresDriver``; ``open`` is the only thing it adds."""

    @classmethod
    async def open(cls, dsn: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 5.0,
                   lock_timeout_ms: int = 5000, statement_timeout: float = 10.0,
                   down_wait: float = 0.2) -> PostgresStore:
        """Migrate the schema of the database at ``dsn``, then open a pool of connections to it. A statement
        without an answer within ``statement_timeout`` seconds fails (``PostgresDriver``), on the server too;
        while the database cannot be reached, a call waits at most ``down_wait`` seconds for a connection."""
        where = redact_dsn(dsn)
        kwargs = _connection_options(connect_timeout, statement_timeout)
        try:
            async with await AsyncConnection.connect(dsn, **kwargs) as conn:
                await migrate(PostgresDriver(conn, where))  # a long migration is not cut short
            pool = await _open_pool(dsn, kwargs, min_size=min_size, max_size=max_size, timeout=connect_timeout,
                                    settings={"lock_timeout": f"{lock_timeout_ms}ms",
                                              "statement_timeout": f"{round(statement_timeout * 1000)}ms"})
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot open the PostgreSQL store at {where}: {reason(exc)}") from exc
        return cls(PostgresDriver(pool, where, answer_timeout=statement_timeout, down_wait=down_wait))


async def reach(dsn: str, *, connect_timeout: float) -> None:
    """One connection to the database at ``dsn`` answers ``SELECT 1``; nothing is created or migrated.
    ``StoreUnavailableError`` otherwise."""
    timeout = max(1, round(connect_timeout))
    try:
        async with await AsyncConnection.connect(dsn, autocommit=True, connect_timeout=timeout) as conn:
            await conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise StoreUnavailableError(f"cannot reach the PostgreSQL store at {redact_dsn(dsn)}: {reason(exc)}") from None


def _connection_options(connect_timeout: float, statement_timeout: float) -> dict[str, Any]:
    """libpq options of every connection: autocommit, a bounded connect, and TCP that notices a dead peer
    (keepalives on idle connections, ``tcp_user_timeout`` on unacknowledged data; ignored on Unix sockets)."""
    idle = max(1, math.ceil(statement_timeout / 2))
    return {"autocommit": True, "connect_timeout": max(1, math.ceil(connect_timeout)), "keepalives": 1,
            "keepalives_idle": idle, "keepalives_interval": max(1, idle // 3), "keepalives_count": 3,
            "tcp_user_timeout": round(statement_timeout * 1000)}


async def _open_pool(dsn: str, kwargs: dict[str, Any], *, min_size: int, max_size: int, timeout: float,
                     settings: dict[str, str]) -> Pool:
    """A pool with ``min_size`` connections ready; ``timeout`` also bounds the wait for a free connection, and
    how long the pool keeps trying to replace a lost connection (pausing 1, 2, 4... s between tries) before it
    gives up and opens one again only when a call asks: after an outage, a connection is back within a pause
    of at most ``timeout``. Each new connection gets ``settings`` (lock and statement timeouts)."""
    pool: Pool = Pool(dsn, kwargs=kwargs, min_size=min_size, max_size=max_size, timeout=timeout, open=False,
                      name="toolbooth", configure=functools.partial(_configure, settings=settings),
                      reconnect_timeout=timeout)
    try:
        await pool.open(wait=True, timeout=timeout)
    except BaseException:
        await pool.close()
        raise
    return pool


async def _configure(conn: AsyncConnection[Any], *, settings: dict[str, str]) -> None:
    """Bound lock waits (as SQLite's busy timeout does) and statements of each new connection."""
    for name, value in settings.items():
        await conn.execute("SELECT set_config(%s, %s, false)", (name, value))
