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

__all__ = ["PostgresStore"]


class PostgresStore(SqlStore):
    """``SqlStore`` over a pooled ``PostgresDriver``; ``open`` is the only thing it adds."""

    @classmethod
    async def open(cls, dsn: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 5.0,
                   lock_timeout_ms: int = 5000) -> PostgresStore:
        """Migrate the schema of the database at ``dsn``, then open a pool of connections to it."""
        where = redact_dsn(dsn)
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, math.ceil(connect_timeout))}
        try:
            async with await AsyncConnection.connect(dsn, **kwargs) as conn:
                await migrate(PostgresDriver(conn, where))
            pool = await _open_pool(dsn, kwargs, min_size=min_size, max_size=max_size, timeout=connect_timeout,
                                    lock_timeout_ms=lock_timeout_ms)
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot open the PostgreSQL store at {where}: {reason(exc)}") from exc
        return cls(PostgresDriver(pool, where))


async def _open_pool(dsn: str, kwargs: dict[str, Any], *, min_size: int, max_size: int, timeout: float,
                     lock_timeout_ms: int) -> Pool:
    """A pool with ``min_size`` connections ready; ``timeout`` also bounds the wait for a free connection."""
    pool: Pool = Pool(dsn, kwargs=kwargs, min_size=min_size, max_size=max_size, timeout=timeout, open=False,
                      name="toolbooth", configure=functools.partial(_configure, lock_timeout_ms=lock_timeout_ms))
    try:
        await pool.open(wait=True, timeout=timeout)
    except BaseException:
        await pool.close()
        raise
    return pool


async def _configure(conn: AsyncConnection[Any], *, lock_timeout_ms: int) -> None:
    """Bound lock waits of each new connection, as SQLite's busy timeout does."""
    await conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{lock_timeout_ms}ms",))
