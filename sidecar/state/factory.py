"""Opening the configured store."""

from __future__ import annotations

from sidecar.config import StoreSettings
from sidecar.metrics import Metrics
from sidecar.state.journal import Journal
from sidecar.state.sql_store import SqlStore
from sidecar.state.sqlite import SqliteStore
from sidecar.state.store import Store

__all__ = ["open_store"]


async def open_store(settings: StoreSettings, *, metrics: Metrics | None = None) -> Store:
    """The PostgreSQL store when ``postgres_dsn`` is set, else the SQLite file; with its local journal, and its
    failures and audit queue in ``metrics`` (when given)."""
    store: SqlStore
    if settings.postgres_dsn is not None:
        from sidecar.state.postgres import PostgresStore  # imports psycopg: only when configured

        store = await PostgresStore.open(settings.postgres_dsn.get_secret_value(), min_size=settings.pool_min_size,
                                         max_size=settings.pool_max_size,
                                         connect_timeout=settings.connect_timeout_seconds,
                                         lock_timeout_ms=settings.busy_timeout_ms,
                                         statement_timeout=settings.statement_timeout_seconds,
                                         down_wait=settings.down_wait_seconds)
    else:
        store = await SqliteStore.open(settings.sqlite_path, busy_timeout_ms=settings.busy_timeout_ms)
    store.linger_audit(settings.audit_linger_ms / 1000)
    if metrics is not None:
        store.observe(metrics)
    try:
        await store.keep_in(Journal.open(settings.journal_path(), settings.identity()))
    except BaseException:
        await store.aclose()
        raise
    return store
