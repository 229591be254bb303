"""Opening the configured store: its backend's row (``sidecar.state.backends``), with the local journal."""

from __future__ import annotations

from sidecar.config import StoreSettings
from sidecar.metrics import Metrics
from sidecar.state.backends import backend_for
from sidecar.state.journal import Journal
from sidecar.state.store import Store

__all__ = ["open_store"]


async def open_store(settings: StoreSettings, *, metrics: Metrics | None = None) -> Store:
    """The store of ``settings.kind`` (PostgreSQL when ``postgres_dsn`` is set, else the SQLite file); with its
    local journal, and its failures and audit queue in ``metrics`` (when given)."""
    store = await backend_for(settings).open(settings)
    store.linger_audit(settings.audit_linger_ms / 1000)
    if metrics is not None:
        store.observe(metrics)
    try:
        await store.keep_in(Journal.open(settings.journal_path(), settings.identity()))
    except BaseException:
        await store.aclose()
        raise
    return store
