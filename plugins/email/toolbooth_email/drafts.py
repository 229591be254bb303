"""Drafts of ``send_email_preview`` in SQLite or PostgreSQL, and the one-way life of each: claimed once, sent once.

A draft is ``pending`` until a ``send_email`` claims it (``sending``: one atomic update, so of two calls
— with any idempotency keys, on any sidecars sharing the database — only one gets it: on PostgreSQL the
second update waits for the first one's row lock, then finds the draft no longer pending). It then ends as
``sent`` (with the result), ``refused`` (the server refused the whole message: nothing was sent),
``unknown`` (the connection failed while the message was being transferred: it may have been delivered)
or, only when nothing was sent and trying again may work, is ``released`` back to ``pending`` by the call
that claimed it. A draft left ``sending`` by a process that died is never sent again by itself.

The statements are written once (``DraftStore``), with ``?`` placeholders; a backend only runs them:
``SqliteDrafts`` (a file, the default) or ``PostgresDrafts`` (``drafts_dsn``). Every operation opens its own
connection (SQLite's in a worker thread; no pool bound to an event loop), so a store holds no state across
calls but whether its table exists. A failing database raises ``DraftStoreError``, whose message never shows
the DSN.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolbooth_email.models import SendEmailPreviewOutput
from toolbooth_email.settings import EmailSettings

__all__ = ["Draft", "DraftStore", "DraftStoreError", "PostgresDrafts", "SqliteDrafts", "State", "open_drafts"]

State = Literal["pending", "sending", "sent", "refused", "unknown"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS email_drafts (
    preview_id   TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    preview_json TEXT NOT NULL,
    preview_hash TEXT NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    expires_at   DOUBLE PRECISION NOT NULL,
    state        TEXT NOT NULL DEFAULT 'pending',
    send_key     TEXT,
    result_json  TEXT
)
"""
_COLUMNS = "preview_id, tenant, principal_id, preview_json, created_at, expires_at, state, send_key, result_json"
_ready: set[str] = set()  # the stores whose table exists: "sqlite:PATH" or "postgres:DSN"
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
    """The drafts' operations, written once over a backend's ``_run``."""

    async def save(self, draft: Draft) -> None:
        """Store a new draft."""
        await self._run("INSERT INTO email_drafts (preview_id, tenant, principal_id, preview_json, preview_hash, "
                        "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (draft.preview_id, draft.tenant, draft.principal_id, draft.preview.model_dump_json(),
                         draft.preview.preview_hash, draft.created_at, draft.expires_at))

    async def get(self, preview_id: str) -> Draft | None:
        """The draft ``preview_id`` names, if there is one."""
        rows, _ = await self._run(f"SELECT {_COLUMNS} FROM email_drafts WHERE preview_id = ?", (preview_id,))
        if not rows:
            return None
        (pid, tenant, principal, preview, created, expires, state, key, result), = rows
        return Draft(pid, tenant, principal, SendEmailPreviewOutput.model_validate_json(preview), created, expires,
                     state, key, result)

    async def claim(self, preview_id: str, key: str, now: float) -> bool:
        """Make ``key``'s call the one that sends the draft: true for exactly one caller of an unexpired
        pending draft."""
        _, changed = await self._run("UPDATE email_drafts SET state = 'sending', send_key = ? "
                                     "WHERE preview_id = ? AND state = 'pending' AND expires_at > ?",
                                     (key, preview_id, now))
        return changed == 1

    async def release(self, preview_id: str, key: str) -> None:
        """Give a claimed draft back (nothing was sent): a later call may send it."""
        await self._run("UPDATE email_drafts SET state = 'pending', send_key = NULL "
                        "WHERE preview_id = ? AND state = 'sending' AND send_key = ?", (preview_id, key))

    async def settle(self, preview_id: str, key: str, state: State, result_json: str | None = None) -> None:
        """Record how the claimed draft ended: ``sent``, ``refused`` or ``unknown``."""
        await self._run("UPDATE email_drafts SET state = ?, result_json = ? "
                        "WHERE preview_id = ? AND state = 'sending' AND send_key = ?",
                        (state, result_json, preview_id, key))

    async def _run(self, sql: str, params: tuple[Any, ...]) -> tuple[list[tuple[Any, ...]], int]:
        """Run one statement (committed on return): its rows and the number of rows it changed."""
        raise NotImplementedError


class SqliteDrafts(DraftStore):
    """The drafts in the SQLite file ``path`` (created with its directory when missing; WAL journal)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def _run(self, sql: str, params: tuple[Any, ...]) -> tuple[list[tuple[Any, ...]], int]:
        try:
            return await asyncio.to_thread(self._execute, sql, params)
        except (sqlite3.Error, OSError) as exc:
            raise DraftStoreError(f"the email draft store {self.path} failed: {exc}") from exc

    def _execute(self, sql: str, params: tuple[Any, ...]) -> tuple[list[tuple[Any, ...]], int]:
        self._prepare()
        connection = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        try:
            cursor = connection.execute(sql, params)
            return cursor.fetchall(), cursor.rowcount
        finally:
            connection.close()

    def _prepare(self) -> None:
        with _ready_lock:
            if f"sqlite:{self.path}" in _ready and self.path.exists():
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(_SCHEMA)
            finally:
                connection.close()
            _ready.add(f"sqlite:{self.path}")


class PostgresDrafts(DraftStore):
    """The drafts in the PostgreSQL database ``dsn`` (its ``search_path`` picks the schema), shared by every
    sidecar pointed at it."""

    def __init__(self, dsn: str, *, connect_timeout: int = 2) -> None:
        self._dsn, self._connect_timeout = dsn, connect_timeout

    async def _run(self, sql: str, params: tuple[Any, ...]) -> tuple[list[tuple[Any, ...]], int]:
        import psycopg  # loads only for drafts kept in PostgreSQL

        try:
            async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True,
                                                             connect_timeout=self._connect_timeout) as connection:
                if f"postgres:{self._dsn}" not in _ready:
                    async with connection.transaction():  # concurrent CREATE TABLE IF NOT EXISTS can collide
                        await connection.execute("SELECT pg_advisory_xact_lock(hashtext('toolbooth_email_drafts'))")
                        await connection.execute(_SCHEMA)
                    _ready.add(f"postgres:{self._dsn}")
                cursor = await connection.execute(sql.replace("?", "%s"), params)
                return (await cursor.fetchall() if cursor.description else []), cursor.rowcount
        except (psycopg.Error, OSError) as exc:
            # psycopg's messages may name the host and user (never the password): they stay in the chained cause.
            raise DraftStoreError(f"the email draft store (PostgreSQL) failed: {type(exc).__name__}") from exc


def open_drafts(settings: EmailSettings) -> DraftStore:
    """The draft store the settings name: PostgreSQL when ``drafts_dsn`` is set, else the SQLite file."""
    if settings.drafts_dsn is not None:
        return PostgresDrafts(settings.drafts_dsn.get_secret_value())
    return SqliteDrafts(settings.drafts_path)
