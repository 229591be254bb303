"""The store backends by kind: the one table (``BACKENDS``) saying how each ``StoreKind`` opens and is reached.

``StoreSettings.kind`` (``sidecar.config.store``) says which backend the settings name, and what differs
in their settings; a row here opens that backend's store (creating and migrating its schema) and checks,
without creating or changing anything, that it could (``toolbooth config validate``). Nothing else tells
the backends apart: a new one is a value of ``StoreKind`` with its settings facts, one package beside
``sqlite`` and ``postgres`` (a driver with its ``Dialect``, migrations, a store) and one row here.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from sidecar.config.store import StoreKind, StoreSettings
from sidecar.state.sql_store import SqlStore
from sidecar.state.sqlite.reach import reach_file
from sidecar.state.sqlite.store import SqliteStore

__all__ = ["BACKENDS", "StoreBackend", "backend_for"]


class StoreBackend(Protocol):
    """How one kind of store opens, and is reached before it does."""

    async def open(self, settings: StoreSettings) -> SqlStore:
        """The store, its schema migrated to the latest version; ``StoreUnavailableError`` when it cannot."""
        ...

    async def reach(self, settings: StoreSettings) -> None:
        """``StoreUnavailableError`` unless the store could be opened; creates and migrates nothing."""
        ...


class _Sqlite:
    """A local file (``store.sqlite_path``), the default: it needs nothing installed."""

    async def open(self, settings: StoreSettings) -> SqlStore:
        return await SqliteStore.open(settings.sqlite_path, busy_timeout_ms=settings.busy_timeout_ms)

    async def reach(self, settings: StoreSettings) -> None:
        await asyncio.to_thread(reach_file, settings.sqlite_path)


class _Postgres:
    """A database shared by replicas (``store.postgres_dsn``); psycopg is imported only when it is configured."""

    async def open(self, settings: StoreSettings) -> SqlStore:
        from sidecar.state.postgres.store import PostgresStore

        return await PostgresStore.open(settings.dsn(), min_size=settings.pool_min_size,
                                        max_size=settings.pool_max_size,
                                        connect_timeout=settings.connect_timeout_seconds,
                                        lock_timeout_ms=settings.busy_timeout_ms,
                                        statement_timeout=settings.statement_timeout_seconds,
                                        down_wait=settings.down_wait_seconds)

    async def reach(self, settings: StoreSettings) -> None:
        from sidecar.state.postgres.store import reach

        await reach(settings.dsn(), connect_timeout=settings.connect_timeout_seconds)


BACKENDS: dict[StoreKind, StoreBackend] = {StoreKind.SQLITE: _Sqlite(), StoreKind.POSTGRES: _Postgres()}


def backend_for(settings: StoreSettings) -> StoreBackend:
    """The row of ``settings.kind``."""
    return BACKENDS[settings.kind]
