"""The index seam: what the tools and the indexer ask of a backend, and the backend a setting names.

Both backends (``sqlite_index``, ``postgres_index``) keep the same data: documents with their tenant,
project, version and whether they are restricted; the projects of each tenant; the cursor key.
Search looks only at the caller's tenant and matches a restricted document by its title alone (its
body is never indexed), giving it no snippet. A backend raises ``IndexUnavailable`` for a failure
that may pass (the database locked, unreachable, restarting), never for a bad request.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

from toolbooth_documents.records import After, Change, Document, Hit, Listed, Passage
from toolbooth_documents.settings import IndexSettings

__all__ = ["Index", "open_index"]


class Index(Protocol):
    """A full-text index of documents, opened lazily: its schema is created on first use."""

    async def cursor_key(self) -> bytes:
        """The key that signs cursors: the configured one, else the one generated and kept in the index."""
        ...

    async def search(self, tenant: str, words: Sequence[str], project_id: str | None, after: After | None,
                     limit: int, *, timeout: float) -> list[Hit]:
        """Up to ``limit`` documents of ``tenant`` (of ``project_id`` only, if given) containing every word,
        best first, from after ``after``; ``UnknownProject`` if ``tenant`` has no project ``project_id``."""
        ...

    async def read(self, tenant: str, document_id: str, offset: int, length: int, *,
                   timeout: float) -> Passage | None:
        """Up to ``length`` characters of the body from ``offset``, if ``tenant`` has the document."""
        ...

    async def add_project(self, tenant: str, project_id: str) -> None:
        """Record that ``tenant`` has project ``project_id`` (a search may then name it, even while empty)."""
        ...

    async def upsert(self, documents: Sequence[Document]) -> list[tuple[Change, int]]:
        """Add or update ``documents`` in one transaction: a changed one gets the next version."""
        ...

    async def delete(self, document_id: str) -> Listed | None:
        """Remove a document; what it was, or ``None`` if there is none with that id."""
        ...

    async def documents(self, tenant: str | None, project_id: str | None) -> list[Listed]:
        """The documents (of ``tenant`` and ``project_id``, if given), by tenant, project and title."""
        ...


@functools.lru_cache(maxsize=16)
def open_index(settings: IndexSettings) -> Index:
    """The index ``settings`` name (one object per setting: it keeps its schema check and key)."""
    if settings.dsn is not None:
        from toolbooth_documents.postgres_index import PostgresIndex

        return PostgresIndex(settings.dsn, settings.read_cursor_key())
    from toolbooth_documents.sqlite_index import SqliteIndex

    return SqliteIndex(settings.sqlite_path, settings.read_cursor_key())
