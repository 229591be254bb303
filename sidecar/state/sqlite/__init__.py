"""The SQLite backend: a driver (one connection, one worker thread, WAL) and its migrations; ``reach`` checks a
file could be opened, changing nothing.

Migrations are ``sidecar/state/migrations/sqlite/NNNN_*.sql``; files from before versioned migrations
are upgraded in place (``legacy``).
"""

from __future__ import annotations

from sidecar.state.sqlite.driver import SQLITE, SqliteDriver
from sidecar.state.sqlite.legacy import adopt_unversioned
from sidecar.state.sqlite.store import SqliteStore

__all__ = ["SQLITE", "SqliteDriver", "SqliteStore", "adopt_unversioned"]
