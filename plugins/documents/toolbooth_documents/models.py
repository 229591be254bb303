"""Input and output models of ``search_documents`` and ``read_document``; their JSON schema is what the model sees."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from toolbooth_documents.cursors import MAX_CURSOR_CHARS
from toolbooth_documents.records import DOCUMENT_ID_PATTERN, NAME_PATTERN
from toolbooth_documents.terms import query_words

__all__ = ["DEFAULT_LIMIT", "DEFAULT_MAX_CHARACTERS", "MAX_LIMIT", "MAX_MAX_CHARACTERS", "MAX_QUERY_CHARS",
           "MIN_MAX_CHARACTERS", "ReadDocumentInput", "ReadDocumentOutput", "SearchDocumentsInput",
           "SearchDocumentsOutput", "SearchItem"]

MAX_QUERY_CHARS = 500
DEFAULT_LIMIT, MAX_LIMIT = 10, 20
DEFAULT_MAX_CHARACTERS, MIN_MAX_CHARACTERS, MAX_MAX_CHARACTERS = 5000, 1000, 20_000

_DOCUMENT_ID = re.compile(DOCUMENT_ID_PATTERN)
_Count = Annotated[int, Strict()]  # a JSON integer: not 5.0, "5" or true
_Cursor = Annotated[str, Field(min_length=1, max_length=MAX_CURSOR_CHARS)]


class SearchDocumentsInput(BaseModel):
    """A full-text search in the documents the caller's organization may see."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description=(
        "Words to look for, as plain text (no operators): documents containing all of them are returned, "
        "best matches first. Common words such as 'the' are ignored; word endings do not matter."))
    project_id: str | None = Field(default=None, pattern=NAME_PATTERN, description=(
        "Only documents of this project of your organization; leave it out to search all of its projects."))
    cursor: _Cursor | None = Field(default=None, description=(
        "next_cursor of the previous page of this same search (same query and project_id), to get the next "
        "page; leave it out for the first page."))
    limit: _Count = Field(default=DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Results per page, 1 to 20.")

    @field_validator("query")
    @classmethod
    def _has_words(cls, query: str) -> str:
        if not query_words(query):
            raise ValueError("the query has no words to search for: only punctuation or common words such as 'the'")
        return query


class SearchItem(BaseModel):
    """One document found."""

    model_config = ConfigDict(extra="forbid")

    document_id: str = Field(description="Pass it to read_document to read the document.")
    project_id: str
    title: str
    snippet: str = Field(description="A short passage around the words found; empty for a restricted document.")
    restricted: bool = Field(description="A restricted document matches by its title only and shows no snippet.")
    updated_at: str = Field(description="When the document last changed (RFC 3339, UTC).")


class SearchDocumentsOutput(BaseModel):
    """One page of search results."""

    model_config = ConfigDict(extra="forbid")

    items: list[SearchItem]
    next_cursor: str | None = Field(default=None, description="Pass it as cursor for the next page (if has_more).")
    has_more: bool = Field(description="Whether more results follow this page.")


class ReadDocumentInput(BaseModel):
    """Read one document, a part at a time."""

    model_config = ConfigDict(extra="forbid")

    document_id: str = Field(json_schema_extra={"pattern": DOCUMENT_ID_PATTERN}, description=(
        "The document_id search_documents returned: 'doc_' and 24 hexadecimal digits."))
    cursor: _Cursor | None = Field(default=None, description=(
        "next_cursor of the previous read of this document, to read on; leave it out to read from the start."))
    max_characters: _Count = Field(
        default=DEFAULT_MAX_CHARACTERS, ge=MIN_MAX_CHARACTERS, le=MAX_MAX_CHARACTERS,
        description="At most this many characters of content, 1000 to 20000.")

    @field_validator("document_id")
    @classmethod
    def _document_id(cls, value: str) -> str:
        if not _DOCUMENT_ID.match(value):
            raise ValueError("not a document id: use a document_id returned by search_documents "
                             "('doc_' and 24 hexadecimal digits)")
        return value


class ReadDocumentOutput(BaseModel):
    """A part of a document: all of it unless truncated."""

    model_config = ConfigDict(extra="forbid")

    document_id: str
    project_id: str
    title: str
    content: str
    truncated: bool = Field(description="True if the document goes on after content: read on with next_cursor.")
    next_cursor: str | None = Field(default=None, description="Pass it as cursor to read the rest (if truncated).")
    updated_at: str = Field(description="When the document last changed (RFC 3339, UTC).")
