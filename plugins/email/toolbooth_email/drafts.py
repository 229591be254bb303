"""Drafts of ``send_email_preview`` in SQLite, and the one-way life of each: claimed once, sent once.

A draft is ``pending`` until a ``send_email`` claims it (``sending``: one atomic update, so of two calls
— with any idempotency keys, on any sidecars sharing the file — only one gets it). It then ends as
``sent`` (with the result), ``refused`` (the server refused the whole message: nothing was sent),
``unknown`` (the connection failed while the message was being transferred: it may have been delivered)
or, only when nothing was sent and trying again may work, is ``released`` back to ``pending`` by the call
that claimed it. A draft left ``sending`` by a process that died is never sent again by itself.

Every operation opens its own connection (in a worker thread), so the store holds no state across calls.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolbooth_email.models import SendEmailPreviewOutput

__all__ = ["Draft", "DraftStore", "DraftStoreError", "State"]

State = Literal["pending", "sending", "sent", "refused", "unknown"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS email_drafts (
    preview_id   TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    preview_json TEXT NOT NULL,
    preview_hash TEXT NOT NULL,
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    state        TEXT NOT NULL DEFAULT 'pending',
    send_key     TEXT,
    result_json  TEXT
)
"""
_COLUMNS = "preview_id, tenant, principal_id, preview_json, created_at, expires_at, state, send_key, result_json"
_ready: set[Path] = set()
_ready_lock = threading.Lock()


class DraftStoreError(Exception):
    """The draft store could not be read or written (locked, disk full, unreadable file)."""


@dataclass(frozen=True, slots=True)
class Draft:
    """One stored draft: whose it is, what it renders to, until when, and where it is in its life."""

    preview_id: str
    tenant: str
    principal_id: str
    preview: SendEmailPreviewOutput
    created_at: float
    expires_at: float
    state: State = "pending"
    send_key: str | None = None
    result_json: str | None = None


class DraftStore:
    """The drafts in the SQLite file ``path`` (created with its directory when missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def save(self, draft: Draft) -> None:
        """Store a new draft."""
        await self._run("INSERT INTO email_drafts (preview_id, tenant, principal_id, preview_json, preview_hash, "
                        "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (draft.preview_id, draft.tenant, draft.principal_id, draft.preview.model_dump_json(),
                         draft.preview.preview_hash, draft.created_at, draft.expires_at))

    async def get(self, preview_id: str) -> Draft | None:
        """The draft ``preview_id`` names, if there is one."""
        rows = await self._run(f"SELECT {_COLUMNS} FROM email_drafts WHERE preview_id = ?", (preview_id,))
        if not rows:
            return None
        (pid, tenant, principal, preview, created, expires, state, key, result), = rows
        return Draft(pid, tenant, principal, SendEmailPreviewOutput.model_validate_json(preview), created, expires,
                     state, key, result)

    async def claim(self, preview_id: str, key: str, now: float) -> bool:
        """Make ``key``'s call the one that sends the draft: true for exactly one caller of an unexpired
        pending draft."""
        return await self._changed("UPDATE email_drafts SET state = 'sending', send_key = ? "
                                   "WHERE preview_id = ? AND state = 'pending' AND expires_at > ?",
                                   (key, preview_id, now))

    async def release(self, preview_id: str, key: str) -> None:
        """Give a claimed draft back (nothing was sent): a later call may send it."""
        await self._changed("UPDATE email_drafts SET state = 'pending', send_key = NULL "
                            "WHERE preview_id = ? AND state = 'sending' AND send_key = ?", (preview_id, key))

    async def settle(self, preview_id: str, key: str, state: State, result_json: str | None = None) -> None:
        """Record how the claimed draft ended: ``sent``, ``refused`` or ``unknown``."""
        await self._changed("UPDATE email_drafts SET state = ?, result_json = ? "
                            "WHERE preview_id = ? AND state = 'sending' AND send_key = ?",
                            (state, result_json, preview_id, key))

    async def _changed(self, sql: str, params: tuple[Any, ...]) -> bool:
        return bool(await asyncio.to_thread(self._execute, sql, params, True))

    async def _run(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = await asyncio.to_thread(self._execute, sql, params, False)
        return rows

    def _execute(self, sql: str, params: tuple[Any, ...], count: bool) -> Any:
        try:
            self._prepare()
            connection = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            try:
                cursor = connection.execute(sql, params)
                return cursor.rowcount if count else cursor.fetchall()
            finally:
                connection.close()
        except (sqlite3.Error, OSError) as exc:
            raise DraftStoreError(f"the email draft store {self.path} failed: {exc}") from exc

    def _prepare(self) -> None:
        with _ready_lock:
            if self.path in _ready and self.path.exists():
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(_SCHEMA)
            finally:
                connection.close()
            _ready.add(self.path)
