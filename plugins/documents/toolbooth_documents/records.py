"""What the index stores and returns, independent of its backend; and the backends' shared errors."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

__all__ = ["DOCUMENT_ID_PATTERN", "NAME_PATTERN", "After", "Change", "Document", "Hit", "IndexUnavailable",
           "Listed", "Passage", "UnknownProject", "check_name", "document_id", "rfc3339"]

DOCUMENT_ID_PATTERN = r"^doc_[0-9a-f]{24}$"
"""The one document id format: ``doc_`` and 24 lowercase hex digits."""

NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$"
"""Tenants and projects given to the indexer: 1-64 letters, digits and inner ``.``, ``_`` or ``-``."""

_NAME = re.compile(NAME_PATTERN)


class IndexUnavailable(Exception):
    """The index could not be reached or read just now (a transient failure: trying again may work)."""


class UnknownProject(Exception):
    """A search named a project the caller's tenant does not have."""


class Change(StrEnum):
    """What indexing did to one document."""

    ADDED = "added"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


def document_id(tenant: str, project_id: str, source: str) -> str:
    """The stable id of the document loaded from ``source`` (a path relative to the indexed directory)."""
    digest = hashlib.sha256("\0".join((tenant, project_id, source)).encode()).hexdigest()
    return f"doc_{digest[:24]}"


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a valid tenant or project name, else ``ValueError`` naming ``kind``."""
    if not _NAME.match(value):
        raise ValueError(f"{kind} {value!r} must be 1-64 letters, digits and inner '.', '_' or '-'")
    return value


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC to the second, e.g. ``2026-07-18T12:30:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Document:
    """One document to index. A restricted document's body is stored but never indexed for search."""

    document_id: str
    tenant: str
    project_id: str
    source: str
    title: str
    body: str
    restricted: bool
    updated_at: datetime

    @property
    def content_hash(self) -> str:
        """What a new version changes: the title, the body or whether the document is restricted."""
        canonical = json.dumps([self.title, self.body, self.restricted], ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class After:
    """Where a page of search results ended: its last hit's score and id (results go by score, then id)."""

    score: float
    document_id: str


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result; ``snippet`` is empty for a restricted document."""

    document_id: str
    project_id: str
    title: str
    snippet: str
    restricted: bool
    updated_at: datetime
    score: float


@dataclass(frozen=True, slots=True)
class Passage:
    """Part of one document: ``text`` starts at character ``offset`` of a body ``length`` characters long."""

    document_id: str
    project_id: str
    title: str
    restricted: bool
    updated_at: datetime
    version: int
    offset: int
    length: int
    text: str


@dataclass(frozen=True, slots=True)
class Listed:
    """One document as ``toolbooth-documents list`` shows it."""

    document_id: str
    tenant: str
    project_id: str
    version: int
    restricted: bool
    updated_at: datetime
    title: str
    source: str
