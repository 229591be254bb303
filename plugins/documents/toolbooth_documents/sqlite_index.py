"""The SQLite index: a file with the documents and an FTS5 table over their titles and bodies (Porter stems).

Every operation opens its own connection in a worker thread (WAL mode: the indexer writes while searches
read); a call cancelled at its deadline aborts its statements. A search or read waits for a lock at
most half its time left, then is ``IndexUnavailable``, so that the sidecar's retry has time to run. A
restricted document's body is kept in ``toolbooth_documents`` but never put in the FTS table, so no query
can match it or quote it. Relevance is FTS5's BM25, the title weighing four times the body.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from toolbooth_documents.records import (
    After,
    Change,
    Document,
    Hit,
    IndexUnavailable,
    Listed,
    Passage,
    UnknownProject,
    rfc3339,
)
from toolbooth_documents.settings import ConfigurationError
from toolbooth_documents.terms import fts5_query

__all__ = ["SCHEMA_VERSION", "SqliteIndex"]

SCHEMA_VERSION = "1"
_WRITE_TIMEOUT = 30.0  # seconds an indexer waits for another writer
_PROGRESS_STEPS = 10_000
_LOCK_SHARE = 0.5  # of a call's time left, what a search or read waits for a lock: a retry still fits

_SCHEMA = """
CREATE TABLE IF NOT EXISTS toolbooth_documents_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS toolbooth_document_projects (
    tenant TEXT NOT NULL, project_id TEXT NOT NULL, PRIMARY KEY (tenant, project_id));
CREATE TABLE IF NOT EXISTS toolbooth_documents (
    id INTEGER PRIMARY KEY,
    document_id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    project_id TEXT NOT NULL,
    source TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    restricted INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    version INTEGER NOT NULL,
    content_hash TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS toolbooth_documents_scope ON toolbooth_documents (tenant, project_id);
CREATE VIRTUAL TABLE IF NOT EXISTS toolbooth_documents_fts USING fts5(title, body, tokenize = 'porter unicode61');
"""

_SEARCH = """
SELECT d.id, d.document_id, d.project_id, d.title, d.restricted, d.updated_at, page.score
FROM (SELECT rowid AS id, -bm25(toolbooth_documents_fts, 4.0, 1.0) AS score
      FROM toolbooth_documents_fts WHERE toolbooth_documents_fts MATCH :match) AS page
JOIN toolbooth_documents AS d ON d.id = page.id
WHERE d.tenant = :tenant AND (:project IS NULL OR d.project_id = :project)
  AND (:score IS NULL OR page.score < :score OR (page.score = :score AND d.document_id > :last))
ORDER BY page.score DESC, d.document_id
LIMIT :limit
"""

_SNIPPETS = """
SELECT rowid, snippet(toolbooth_documents_fts, 1, '', '', '…', 24) FROM toolbooth_documents_fts
WHERE toolbooth_documents_fts MATCH ? AND rowid IN ({marks})
"""

_READ = """
SELECT document_id, project_id, title, restricted, updated_at, version, length(body), substr(body, :offset + 1, :length)
FROM toolbooth_documents WHERE document_id = :id AND tenant = :tenant
"""

_LISTED = ("SELECT document_id, tenant, project_id, version, restricted, updated_at, title, source "
           "FROM toolbooth_documents")

T = TypeVar("T")


class SqliteIndex:
    """The index in the SQLite file ``path`` (created, with its directory, on first use); ``connect`` opens
    each connection (``sqlite3.connect``; tests pass one that fails)."""

    def __init__(self, path: Path, cursor_key: bytes | None = None, *,
                 connect: Callable[..., sqlite3.Connection] = sqlite3.connect) -> None:
        self.path = path
        self._connect = connect
        self._configured_key = cursor_key
        self._key: bytes | None = None

    async def cursor_key(self) -> bytes:
        if self._configured_key is not None:
            return self._configured_key
        if self._key is None:
            self._key = await self._run(self._stored_key, timeout=_WRITE_TIMEOUT)
        return self._key

    async def search(self, tenant: str, words: Sequence[str], project_id: str | None, after: After | None,
                     limit: int, *, timeout: float) -> list[Hit]:
        match = fts5_query(tuple(words))

        def work(conn: sqlite3.Connection) -> list[Hit]:
            if project_id is not None and conn.execute(
                    "SELECT 1 FROM toolbooth_document_projects WHERE tenant = ? AND project_id = ?",
                    (tenant, project_id)).fetchone() is None:
                raise UnknownProject(project_id)
            rows = conn.execute(_SEARCH, {
                "match": match, "tenant": tenant, "project": project_id, "limit": limit,
                "score": None if after is None else after.score, "last": None if after is None else after.document_id,
            }).fetchall()
            snippets = dict(conn.execute(_SNIPPETS.format(marks=",".join("?" * len(rows))),
                                         [match, *(row[0] for row in rows)]).fetchall()) if rows else {}
            return [Hit(document_id=doc_id, project_id=project, title=title, restricted=bool(restricted),
                        snippet="" if restricted else snippets.get(rowid, ""), updated_at=_moment(updated),
                        score=score)
                    for rowid, doc_id, project, title, restricted, updated, score in rows]

        return await self._run(work, timeout=timeout * _LOCK_SHARE)

    async def read(self, tenant: str, document_id: str, offset: int, length: int, *,
                   timeout: float) -> Passage | None:
        def work(conn: sqlite3.Connection) -> Passage | None:
            row = conn.execute(_READ, {"id": document_id, "tenant": tenant, "offset": offset,
                                       "length": length}).fetchone()
            if row is None:
                return None
            doc_id, project, title, restricted, updated, version, total, text = row
            return Passage(document_id=doc_id, project_id=project, title=title, restricted=bool(restricted),
                           updated_at=_moment(updated), version=version, offset=offset, length=total, text=text)

        return await self._run(work, timeout=timeout * _LOCK_SHARE)

    async def add_project(self, tenant: str, project_id: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR IGNORE INTO toolbooth_document_projects VALUES (?, ?)", (tenant, project_id))

        await self._run(work, timeout=_WRITE_TIMEOUT)

    async def upsert(self, documents: Sequence[Document]) -> list[tuple[Change, int]]:
        def work(conn: sqlite3.Connection) -> list[tuple[Change, int]]:
            with _transaction(conn):
                return [_upsert(conn, doc) for doc in documents]

        return await self._run(work, timeout=_WRITE_TIMEOUT)

    async def delete(self, document_id: str) -> Listed | None:
        def work(conn: sqlite3.Connection) -> Listed | None:
            with _transaction(conn):
                row = conn.execute(f"{_LISTED} WHERE document_id = ?", (document_id,)).fetchone()
                if row is None:
                    return None
                conn.execute("DELETE FROM toolbooth_documents_fts WHERE rowid = "
                             "(SELECT id FROM toolbooth_documents WHERE document_id = ?)", (document_id,))
                conn.execute("DELETE FROM toolbooth_documents WHERE document_id = ?", (document_id,))
                return _listed(row)

        return await self._run(work, timeout=_WRITE_TIMEOUT)

    async def documents(self, tenant: str | None, project_id: str | None) -> list[Listed]:
        def work(conn: sqlite3.Connection) -> list[Listed]:
            rows = conn.execute(f"{_LISTED} WHERE (:tenant IS NULL OR tenant = :tenant) AND "
                                "(:project IS NULL OR project_id = :project) "
                                "ORDER BY tenant, project_id, title, document_id",
                                {"tenant": tenant, "project": project_id}).fetchall()
            return [_listed(row) for row in rows]

        return await self._run(work, timeout=_WRITE_TIMEOUT)

    async def _run(self, work: Callable[[sqlite3.Connection], T], *, timeout: float) -> T:
        """``work`` on a new connection in a worker thread; a cancelled call aborts its statements."""
        cancelled = threading.Event()
        job = asyncio.get_running_loop().run_in_executor(None, self._work, work, timeout, cancelled)
        job.add_done_callback(_retrieve)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def _work(self, work: Callable[[sqlite3.Connection], T], timeout: float, cancelled: threading.Event) -> T:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._connect(self.path, timeout=max(timeout, 0.001), isolation_level=None,
                                 check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise IndexUnavailable(f"SQLite index {self.path}: cannot open: {exc}") from exc
        try:
            # checked every _PROGRESS_STEPS virtual machine steps: a true result aborts the statement ("interrupted")
            conn.set_progress_handler(cancelled.is_set, _PROGRESS_STEPS)
            _set_up(conn, self.path)
            return work(conn)
        except sqlite3.OperationalError as exc:  # locked, I/O, interrupted: the statements themselves are fixed
            raise IndexUnavailable(f"SQLite index {self.path}: {exc}") from exc
        finally:
            conn.close()

    def _stored_key(self, conn: sqlite3.Connection) -> bytes:
        conn.execute("INSERT OR IGNORE INTO toolbooth_documents_meta VALUES ('cursor_key', ?)",
                     (secrets.token_hex(32),))
        (value,) = conn.execute("SELECT value FROM toolbooth_documents_meta WHERE name = 'cursor_key'").fetchone()
        return bytes.fromhex(value)


def _set_up(conn: sqlite3.Connection, path: Path) -> None:
    """Create the schema if it is missing (one look once it exists); refuse a schema of another version."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'toolbooth_documents_meta'").fetchone()
    if found is None:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} INSERT OR IGNORE INTO toolbooth_documents_meta "
                           f"VALUES ('schema_version', '{SCHEMA_VERSION}'); COMMIT;")
    (version,) = conn.execute("SELECT value FROM toolbooth_documents_meta WHERE name = 'schema_version'").fetchone()
    if version != SCHEMA_VERSION:
        raise ConfigurationError(f"the document index {path} has schema version {version}; "
                                 f"this toolbooth-documents knows version {SCHEMA_VERSION}")


class _transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on an error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        self._conn.execute("COMMIT" if kind is None else "ROLLBACK")


def _upsert(conn: sqlite3.Connection, doc: Document) -> tuple[Change, int]:
    conn.execute("INSERT OR IGNORE INTO toolbooth_document_projects VALUES (?, ?)", (doc.tenant, doc.project_id))
    row = conn.execute("SELECT id, version, content_hash FROM toolbooth_documents WHERE document_id = ?",
                       (doc.document_id,)).fetchone()
    values = {"document_id": doc.document_id, "tenant": doc.tenant, "project_id": doc.project_id,
              "source": doc.source, "title": doc.title, "body": doc.body, "restricted": int(doc.restricted),
              "updated_at": rfc3339(doc.updated_at), "content_hash": doc.content_hash}
    if row is None:
        rowid = conn.execute(
            "INSERT INTO toolbooth_documents (document_id, tenant, project_id, source, title, body, restricted, "
            "updated_at, version, content_hash) VALUES (:document_id, :tenant, :project_id, :source, :title, :body, "
            ":restricted, :updated_at, 1, :content_hash)", values).lastrowid
        change, version = Change.ADDED, 1
    elif row[2] == doc.content_hash:
        return Change.UNCHANGED, row[1]
    else:
        rowid, version = row[0], row[1] + 1
        conn.execute("UPDATE toolbooth_documents SET source = :source, title = :title, body = :body, "
                     "restricted = :restricted, updated_at = :updated_at, version = :version, "
                     "content_hash = :content_hash WHERE id = :id", {**values, "version": version, "id": rowid})
        conn.execute("DELETE FROM toolbooth_documents_fts WHERE rowid = ?", (rowid,))
        change = Change.UPDATED
    conn.execute("INSERT INTO toolbooth_documents_fts (rowid, title, body) VALUES (?, ?, ?)",
                 (rowid, doc.title, "" if doc.restricted else doc.body))
    return change, version


def _listed(row: tuple[Any, ...]) -> Listed:
    doc_id, tenant, project, version, restricted, updated, title, source = row
    return Listed(document_id=doc_id, tenant=tenant, project_id=project, version=version,
                  restricted=bool(restricted), updated_at=_moment(updated), title=title, source=source)


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _retrieve(job: asyncio.Future[Any]) -> None:
    """Fetch the outcome of a job nobody awaits any more (its call was cancelled), so it is not reported."""
    if not job.cancelled():
        job.exception()
