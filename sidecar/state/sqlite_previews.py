"""The preview methods of ``SqliteStore`` (see ``sidecar.state.previews``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from sidecar.contract import PreviewState
from sidecar.state.previews import PreviewRecord, preview_from_row, preview_row, preview_sql

T = TypeVar("T")

PREVIEW_SCHEMA = """
CREATE TABLE IF NOT EXISTS previews (
    preview_id TEXT PRIMARY KEY, preview_hash TEXT NOT NULL, tenant TEXT NOT NULL, principal_id TEXT NOT NULL,
    tool TEXT NOT NULL, tool_version TEXT NOT NULL, call_json TEXT NOT NULL, policy_revision TEXT NOT NULL,
    reason TEXT NOT NULL, approver_roles TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,
    state TEXT NOT NULL, decided_by TEXT, decided_at REAL, comment TEXT, used_at REAL,
    used_key TEXT
);
"""
_SQL = preview_sql("?")


class SqlitePreviews:
    """Preview methods over the store's one connection (``_db``) and worker thread (``_run``)."""

    _db: sqlite3.Connection

    async def _run(self, fn: Callable[[], T]) -> T:
        raise NotImplementedError

    async def save_preview(self, preview: PreviewRecord) -> None:
        await self._run(lambda: self._change(_SQL["insert"], preview_row(preview)))

    async def get_preview(self, preview_id: str) -> PreviewRecord | None:
        row = await self._run(lambda: self._db.execute(_SQL["get"], (preview_id,)).fetchone())
        return None if row is None else preview_from_row(row)

    async def list_previews(self, state: PreviewState, *, limit: int = 100) -> list[PreviewRecord]:
        rows = await self._run(lambda: self._db.execute(_SQL["list"], (state.value, limit)).fetchall())
        return [preview_from_row(row) for row in rows]

    async def decide_preview(self, preview_id: str, state: PreviewState, *, decided_by: str, comment: str | None,
                             now: float) -> bool:
        params = (state.value, decided_by, comment, now, preview_id)
        return await self._run(lambda: self._change(_SQL["decide"], params)) == 1

    async def consume_approval(self, preview_id: str, *, now: float, key: str | None = None) -> bool:
        return await self._run(lambda: self._change(_SQL["consume"], (now, key, preview_id))) == 1

    def _change(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one statement in its own transaction; the number of rows it changed."""
        with self._db:
            return self._db.execute(sql, params).rowcount
