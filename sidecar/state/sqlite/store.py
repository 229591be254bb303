"""The SQLite store, the default: ``SqlStore`` on a local file; it needs nothing installed."""

from __future__ import annotations

from pathlib import Path

from sidecar.errors import StoreUnavailableError
from sidecar.state.migrate import migrate
from sidecar.state.sql_store import SqlStore
from sidecar.state.sqlite.driver import SqliteDriver
from sidecar.state.sqlite.legacy import adopt_unversioned

__all__ = ["SqliteStore"]


class SqliteStore(SqlStore):
    """``SqlStore`` over a ``SqliteDriver``; ``open`` is the only thing it adds."""

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_ms: int = 5000) -> SqliteStore:
        """Open (creating if needed) the database at ``path`` and bring its schema to the latest version."""
        driver = await SqliteDriver.open(path, busy_timeout_ms=busy_timeout_ms)
        try:
            await adopt_unversioned(driver)
            await migrate(driver)
        except (StoreUnavailableError, RuntimeError, ValueError):
            await driver.aclose()
            raise
        return cls(driver)
