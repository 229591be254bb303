"""Where previews and tasks are kept: SQLite (a file) or PostgreSQL (a DSN), the same two tables on both.

A task row names the preview it was made from, and that column is unique: of any number of concurrent
``create`` calls for one preview — any keys, any sidecars sharing the database — one inserts the task and
every other gets that task back. A preview is used once, by the database's own constraint.

Each operation opens its own connection (no pool bound to an event loop); the tables are created on first
use. A database that fails or cannot be reached raises ``StoreUnavailable``, whose message never shows the DSN.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

__all__ = ["PostgresTasks", "SqliteTasks", "StoreUnavailable", "StoredPreview", "TaskRow", "TaskStore"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS task_previews (preview_id TEXT PRIMARY KEY, principal_id TEXT NOT NULL, "
    "tenant TEXT NOT NULL, conversation_id TEXT, preview_hash TEXT NOT NULL, rendering TEXT NOT NULL, "
    "created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tasks (task_id TEXT PRIMARY KEY, "
    "preview_id TEXT NOT NULL UNIQUE REFERENCES task_previews (preview_id), tenant TEXT NOT NULL, "
    "created_by TEXT NOT NULL, project_id TEXT NOT NULL, title TEXT NOT NULL, description TEXT, "
    "assignee_id TEXT, due_at TEXT, priority TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)",
)


class StoreUnavailable(Exception):
    """The task database failed or could not be reached (the cause is chained, for the log)."""


@dataclass(frozen=True, slots=True)
class StoredPreview:
    """A preview of ``create_task_preview``: whose it is, in which conversation, its rendering and expiry."""

    preview_id: str
    principal_id: str
    tenant: str
    conversation_id: str | None
    preview_hash: str
    rendering: str  # TaskRendering as JSON
    created_at: float  # epoch seconds
    expires_at: float


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A created task."""

    task_id: str
    preview_id: str
    tenant: str
    created_by: str
    project_id: str
    title: str
    description: str | None
    assignee_id: str | None
    due_at: str | None
    priority: str
    created_at: float


def _columns(cls: type[Any]) -> str:
    return ", ".join(f.name for f in fields(cls))


def _marks(cls: type[Any]) -> str:
    return ", ".join("?" for _ in fields(cls))


_INSERT_PREVIEW = f"INSERT INTO task_previews ({_columns(StoredPreview)}) VALUES ({_marks(StoredPreview)})"
_SELECT_PREVIEW = f"SELECT {_columns(StoredPreview)} FROM task_previews WHERE preview_id = ?"
_INSERT_TASK = (f"INSERT INTO tasks ({_columns(TaskRow)}) VALUES ({_marks(TaskRow)}) "
                "ON CONFLICT (preview_id) DO NOTHING")
_SELECT_TASK = f"SELECT {_columns(TaskRow)} FROM tasks WHERE "


class TaskStore(Protocol):
    """Previews and tasks."""

    async def save_preview(self, preview: StoredPreview) -> None:
        """Store a new preview."""
        ...

    async def preview(self, preview_id: str) -> StoredPreview | None:
        """The preview ``preview_id``, if stored."""
        ...

    async def create(self, task: TaskRow) -> TaskRow:
        """The one task of ``task.preview_id``: ``task``, inserted now, or the task inserted before."""
        ...

    async def tasks(self, preview_id: str | None = None) -> list[TaskRow]:
        """Every task (of ``preview_id`` only, if given), oldest first."""
        ...


class _SqlTasks:
    """The operations, over a backend's ``_run(sql, params) -> rows``; ``?`` placeholders."""

    async def _run(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def save_preview(self, preview: StoredPreview) -> None:
        await self._run(_INSERT_PREVIEW, astuple(preview))

    async def preview(self, preview_id: str) -> StoredPreview | None:
        rows = await self._run(_SELECT_PREVIEW, (preview_id,))
        return StoredPreview(*rows[0]) if rows else None

    async def create(self, task: TaskRow) -> TaskRow:
        await self._run(_INSERT_TASK, astuple(task))
        (row,) = await self._run(_SELECT_TASK + "preview_id = ?", (task.preview_id,))
        return TaskRow(*row)

    async def tasks(self, preview_id: str | None = None) -> list[TaskRow]:
        where = ("preview_id = ?", (preview_id,)) if preview_id is not None else ("1 = 1", ())
        rows = await self._run(_SELECT_TASK + where[0] + " ORDER BY created_at, task_id", where[1])
        return [TaskRow(*row) for row in rows]


class SqliteTasks(_SqlTasks):
    """The store in a SQLite file (WAL journal; waits up to ``busy_timeout`` seconds for another writer)."""

    def __init__(self, path: Path, *, busy_timeout: float = 2.0) -> None:
        self.path, self._busy_timeout = path, busy_timeout
        self._ready = False

    async def _run(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return await asyncio.to_thread(self._run_sync, sql, params)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"the task database {self.path} failed: {exc}") from exc

    def _run_sync(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
        try:
            if not self._ready:
                connection.execute("PRAGMA journal_mode=WAL")
                for statement in _SCHEMA:
                    connection.execute(statement)
                self._ready = True
            connection.execute("PRAGMA foreign_keys=ON")
            return connection.execute(sql, params).fetchall()
        finally:
            connection.close()


class PostgresTasks(_SqlTasks):
    """The store in a PostgreSQL database (``dsn``; its ``search_path`` picks the schema)."""

    def __init__(self, dsn: str, *, connect_timeout: float = 2.0) -> None:
        self._dsn, self._connect_timeout = dsn, connect_timeout
        self._ready = False

    async def _run(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg  # loads only for a PostgreSQL task store

        try:
            async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, connect_timeout=max(1, round(self._connect_timeout))) as connection:
                if not self._ready:
                    async with connection.transaction():  # concurrent CREATE TABLE IF NOT EXISTS can collide
                        await connection.execute("SELECT pg_advisory_xact_lock(hashtext('toolbooth_tasks_schema'))")
                        for statement in _SCHEMA:
                            await connection.execute(statement)
                    self._ready = True
                cursor = await connection.execute(sql.replace("?", "%s"), params)
                return await cursor.fetchall() if cursor.description else []
        except (psycopg.Error, OSError) as exc:
            # psycopg's messages may name the host and user, never the password; still keep them to the log.
            raise StoreUnavailable(f"the task database failed: {type(exc).__name__}") from exc
