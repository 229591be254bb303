"""Whether a SQLite file could be opened where it is configured, without creating or changing anything."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from sidecar.errors import StoreUnavailableError

__all__ = ["reach_file"]


def reach_file(path: Path, what: str = "SQLite store") -> None:
    """An existing file opens (read-only) as a database; a new one could be created where it is configured.
    ``StoreUnavailableError`` naming ``what`` otherwise."""
    if path.exists():
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"cannot open {what} at {path}: {exc}") from None
        writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
        if not writable:
            raise StoreUnavailableError(f"cannot open {what} at {path}: it or its directory is not writable")
        return
    existing = next(parent for parent in path.parents if parent.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise StoreUnavailableError(f"cannot create {what} at {path}: {existing} is not a writable directory")
