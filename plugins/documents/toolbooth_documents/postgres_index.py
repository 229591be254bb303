"""The PostgreSQL index: PostgreSQL full-text search (``tsvector``, ``tsquery``, a GIN index; ``english`` stems).

The tables go in the first schema of the connection's ``search_path``. ``search`` is a generated column:
the title (weight A) and, unless the document is restricted, the body (weight B), so a restricted body is
never indexed and no query can match or quote it. Relevance is ``ts_rank_cd``; snippets are
``ts_headline`` of the page's hits only. Every operation has its own connection, with a statement timeout
of the call's time left; a connection that fails is ``IndexUnavailable``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from toolbooth_documents.records import After, Change, Document, Hit, IndexUnavailable, Listed, Passage, UnknownProject
from toolbooth_documents.settings import ConfigurationError

__all__ = ["SCHEMA_VERSION", "PostgresIndex"]

SCHEMA_VERSION = "1"
_WRITE_TIMEOUT = 30.0
_SETUP_LOCK = 0x746264_6F6373  # pg_advisory_xact_lock key: one schema set-up at a time

_SCHEMA = """
CREATE TABLE IF NOT EXISTS toolbooth_documents_meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS toolbooth_document_projects (
    tenant text NOT NULL, project_id text NOT NULL, PRIMARY KEY (tenant, project_id));
CREATE TABLE IF NOT EXISTS toolbooth_documents (
    document_id text COLLATE "C" PRIMARY KEY,
    tenant text NOT NULL,
    project_id text NOT NULL,
    source text NOT NULL,
    title text NOT NULL,
    body text NOT NULL,
    restricted boolean NOT NULL,
    updated_at timestamptz NOT NULL,
    version integer NOT NULL,
    content_hash text NOT NULL,
    search tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', title), 'A')
        || CASE WHEN restricted THEN ''::tsvector ELSE setweight(to_tsvector('english', body), 'B') END) STORED);
CREATE INDEX IF NOT EXISTS toolbooth_documents_search ON toolbooth_documents USING GIN (search);
CREATE INDEX IF NOT EXISTS toolbooth_documents_scope ON toolbooth_documents (tenant, project_id);
"""

_SEARCH = """
SELECT page.document_id, page.project_id, page.title, page.restricted, page.updated_at, page.score,
       CASE WHEN page.restricted THEN '' ELSE ts_headline('english', page.body, page.query, %(headline)s) END
FROM (
    SELECT d.document_id, d.project_id, d.title, d.restricted, d.updated_at, d.body, q.query,
           ts_rank_cd(d.search, q.query)::float8 AS score
    FROM toolbooth_documents AS d, plainto_tsquery('english', %(words)s) AS q(query)
    WHERE d.search @@ q.query AND d.tenant = %(tenant)s
      AND (%(project)s::text IS NULL OR d.project_id = %(project)s::text)
      AND (%(score)s::float8 IS NULL OR ts_rank_cd(d.search, q.query)::float8 < %(score)s::float8
           OR (ts_rank_cd(d.search, q.query)::float8 = %(score)s::float8 AND d.document_id > %(last)s::text))
    ORDER BY score DESC, d.document_id
    LIMIT %(limit)s
) AS page
ORDER BY page.score DESC, page.document_id
"""
_HEADLINE = 'StartSel="", StopSel="", MinWords=12, MaxWords=30, MaxFragments=2, FragmentDelimiter=" … "'

_READ = """
SELECT document_id, project_id, title, restricted, updated_at, version, char_length(body),
       substr(body, %(offset)s + 1, %(length)s)
FROM toolbooth_documents WHERE document_id = %(id)s AND tenant = %(tenant)s
"""

_UPSERT = """
INSERT INTO toolbooth_documents AS d (document_id, tenant, project_id, source, title, body, restricted, updated_at,
                                      version, content_hash)
VALUES (%(document_id)s, %(tenant)s, %(project_id)s, %(source)s, %(title)s, %(body)s, %(restricted)s,
        %(updated_at)s, 1, %(content_hash)s)
ON CONFLICT (document_id) DO UPDATE SET source = EXCLUDED.source, title = EXCLUDED.title, body = EXCLUDED.body,
    restricted = EXCLUDED.restricted, updated_at = EXCLUDED.updated_at, content_hash = EXCLUDED.content_hash,
    version = d.version + 1
WHERE d.content_hash <> EXCLUDED.content_hash
RETURNING version
"""

_COLUMNS = "document_id, tenant, project_id, version, restricted, updated_at, title, source"


class PostgresIndex:
    """The index in the PostgreSQL database of ``dsn`` (its tables created on first use)."""

    def __init__(self, dsn: str, cursor_key: bytes | None = None) -> None:
        self._dsn = dsn
        self._configured_key = cursor_key
        self._key: bytes | None = None
        self._ready = False

    async def cursor_key(self) -> bytes:
        if self._configured_key is not None:
            return self._configured_key
        if self._key is None:
            async with self._connection(_WRITE_TIMEOUT) as conn:
                await conn.execute("INSERT INTO toolbooth_documents_meta VALUES ('cursor_key', %s) "
                                   "ON CONFLICT DO NOTHING", (secrets.token_hex(32),))
                row = await (await conn.execute(
                    "SELECT value FROM toolbooth_documents_meta WHERE name = 'cursor_key'")).fetchone()
                assert row is not None
                self._key = bytes.fromhex(row[0])
        return self._key

    async def search(self, tenant: str, words: Sequence[str], project_id: str | None, after: After | None,
                     limit: int, *, timeout: float) -> list[Hit]:
        async with self._connection(timeout) as conn:
            if project_id is not None and await (await conn.execute(
                    "SELECT 1 FROM toolbooth_document_projects WHERE tenant = %s AND project_id = %s",
                    (tenant, project_id))).fetchone() is None:
                raise UnknownProject(project_id)
            rows = await (await conn.execute(_SEARCH, {
                "words": " ".join(words), "tenant": tenant, "project": project_id, "limit": limit,
                "headline": _HEADLINE, "score": None if after is None else after.score,
                "last": None if after is None else after.document_id,
            })).fetchall()
        return [Hit(document_id=doc_id, project_id=project, title=title, restricted=restricted,
                    snippet="" if restricted else snippet, updated_at=updated, score=score)
                for doc_id, project, title, restricted, updated, score, snippet in rows]

    async def read(self, tenant: str, document_id: str, offset: int, length: int, *,
                   timeout: float) -> Passage | None:
        async with self._connection(timeout) as conn:
            row = await (await conn.execute(_READ, {"id": document_id, "tenant": tenant, "offset": offset,
                                                    "length": length})).fetchone()
        if row is None:
            return None
        doc_id, project, title, restricted, updated, version, total, text = row
        return Passage(document_id=doc_id, project_id=project, title=title, restricted=restricted,
                       updated_at=updated, version=version, offset=offset, length=total, text=text)

    async def add_project(self, tenant: str, project_id: str) -> None:
        async with self._connection(_WRITE_TIMEOUT) as conn:
            await conn.execute("INSERT INTO toolbooth_document_projects VALUES (%s, %s) ON CONFLICT DO NOTHING",
                               (tenant, project_id))

    async def upsert(self, documents: Sequence[Document]) -> list[tuple[Change, int]]:
        changes: list[tuple[Change, int]] = []
        async with self._connection(_WRITE_TIMEOUT) as conn, conn.transaction():
            for doc in documents:
                await conn.execute("INSERT INTO toolbooth_document_projects VALUES (%s, %s) "
                                   "ON CONFLICT DO NOTHING", (doc.tenant, doc.project_id))
                row = await (await conn.execute(_UPSERT, {
                    "document_id": doc.document_id, "tenant": doc.tenant, "project_id": doc.project_id,
                    "source": doc.source, "title": doc.title, "body": doc.body, "restricted": doc.restricted,
                    "updated_at": doc.updated_at, "content_hash": doc.content_hash})).fetchone()
                if row is None:
                    kept = await (await conn.execute("SELECT version FROM toolbooth_documents WHERE document_id = %s",
                                                     (doc.document_id,))).fetchone()
                    assert kept is not None
                    changes.append((Change.UNCHANGED, kept[0]))
                else:
                    changes.append((Change.ADDED if row[0] == 1 else Change.UPDATED, row[0]))
        return changes

    async def delete(self, document_id: str) -> Listed | None:
        async with self._connection(_WRITE_TIMEOUT) as conn:
            row = await (await conn.execute(f"DELETE FROM toolbooth_documents WHERE document_id = %s "
                                            f"RETURNING {_COLUMNS}", (document_id,))).fetchone()
        return None if row is None else Listed(*row)

    async def documents(self, tenant: str | None, project_id: str | None) -> list[Listed]:
        async with self._connection(_WRITE_TIMEOUT) as conn:
            rows = await (await conn.execute(
                f"SELECT {_COLUMNS} FROM toolbooth_documents WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s) "
                "AND (%(project)s::text IS NULL OR project_id = %(project)s) "
                "ORDER BY tenant, project_id, title, document_id",
                {"tenant": tenant, "project": project_id})).fetchall()
        return [Listed(*row) for row in rows]

    @asynccontextmanager
    async def _connection(self, timeout: float) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A new autocommit connection whose statements end within ``timeout``; the schema set up once."""
        try:
            async with await psycopg.AsyncConnection.connect(
                    self._with_timeout(timeout), autocommit=True, connect_timeout=max(2, math.ceil(timeout))) as conn:
                if not self._ready:
                    await _set_up(conn)
                    self._ready = True
                yield conn
        except psycopg.OperationalError as exc:  # unreachable, restarting, severed, statement timeout
            raise IndexUnavailable(f"PostgreSQL index: {type(exc).__name__}: {' '.join(str(exc).split())}") from exc

    def _with_timeout(self, timeout: float) -> str:
        options = str(conninfo_to_dict(self._dsn).get("options", ""))
        statement = f"-c statement_timeout={max(1, math.ceil(timeout * 1000))}"
        return make_conninfo(self._dsn, options=f"{options} {statement}".strip())


async def _set_up(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create the tables if they are missing (one at a time); refuse a schema of another version."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK,))
        await conn.execute(_SCHEMA)
        await conn.execute("INSERT INTO toolbooth_documents_meta VALUES ('schema_version', %s) "
                           "ON CONFLICT DO NOTHING", (SCHEMA_VERSION,))
        row = await (await conn.execute(
            "SELECT value FROM toolbooth_documents_meta WHERE name = 'schema_version'")).fetchone()
    if row is None or row[0] != SCHEMA_VERSION:
        raise ConfigurationError(f"the PostgreSQL document index has schema version {row and row[0]}; "
                                 f"this toolbooth-documents knows version {SCHEMA_VERSION}")
