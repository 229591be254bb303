"""The two tools, over any ``Index``: ``build_tools(index)`` defines them (the plugin's over the one its settings
name).

Access: a caller sees only documents of its own tenant (``ctx.principal.tenant``). Another tenant's document, a
deleted one and one that never existed are the same ``RESOURCE_NOT_FOUND``, so an id reveals nothing. A restricted
document is found by its title only, without a snippet; reading it needs the permission
``documents:read_restricted`` held by the caller itself (``principal.permissions``), else ``PERMISSION_DENIED``;
what it reads is labelled ``restricted`` (``RESTRICTED``), which the sidecar records in the conversation's history,
where policies see it (the default ones keep it from being emailed outside). A transient failure of the index is
``SERVICE_UNAVAILABLE``, which the sidecar tries once more (``RETRY``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sidecar.plugin import ErrorCode, RetryPolicy, SideEffect, ToolContext, ToolDefinition, ToolError, tool
from toolbooth_documents.cursors import CursorError, Cursors, SearchScope
from toolbooth_documents.index import Index
from toolbooth_documents.models import (
    ReadDocumentInput,
    ReadDocumentOutput,
    SearchDocumentsInput,
    SearchDocumentsOutput,
    SearchItem,
)
from toolbooth_documents.records import After, IndexUnavailable, Passage, UnknownProject, rfc3339
from toolbooth_documents.terms import query_words

__all__ = ["READ_RESTRICTED", "RESTRICTED", "RETRY", "build_tools", "read", "search"]

READ_RESTRICTED = "documents:read_restricted"
RESTRICTED = "restricted"  # the label of a restricted document's content
RETRY = RetryPolicy(max_attempts=2, initial_backoff=0.05, max_backoff=0.2)
"""Once more after a transient failure (``SERVICE_UNAVAILABLE``), while the deadline allows."""

SEARCH_DESCRIPTION = (
    "Find documents of your organization by full-text search: returns a page of matches (document_id, title, "
    "a snippet, updated_at), best first. Read a match in full with read_document. For more matches call again "
    "with the same query and project_id and cursor set to next_cursor, while has_more is true."
)
READ_DESCRIPTION = (
    "Read one document by the document_id search_documents returned. A long document comes in parts: when "
    "truncated is true, call again with cursor set to next_cursor to read on."
)


def build_tools(index: Callable[[ToolContext], Index]) -> list[ToolDefinition[Any, Any]]:
    """``search_documents`` and ``read_document`` over the index ``index(ctx)`` gives at each call."""

    @tool(name="search_documents", version="1.0.0", side_effect=SideEffect.NONE, permissions=("documents:search",),
          timeout=3.0, retry=RETRY, description=SEARCH_DESCRIPTION)
    async def search_documents(args: SearchDocumentsInput, ctx: ToolContext) -> SearchDocumentsOutput:
        return await search(index(ctx), args, ctx)

    @tool(name="read_document", version="1.0.0", side_effect=SideEffect.NONE, permissions=("documents:read",),
          timeout=2.0, retry=RETRY, description=READ_DESCRIPTION, labels=(RESTRICTED,))
    async def read_document(args: ReadDocumentInput, ctx: ToolContext) -> ReadDocumentOutput:
        return await read(index(ctx), args, ctx)

    return [search_documents, read_document]


async def search(index: Index, args: SearchDocumentsInput, ctx: ToolContext) -> SearchDocumentsOutput:
    """One page of the caller's tenant's documents matching ``args.query``."""
    tenant = ctx.principal.tenant
    scope = SearchScope(tenant=tenant, query=args.query, project_id=args.project_id)
    async with _published(ctx):
        cursors = Cursors(await index.cursor_key())
        after = cursors.open_search(args.cursor, scope) if args.cursor is not None else None
        hits = await index.search(tenant, query_words(args.query), args.project_id, after, args.limit + 1,
                                  timeout=ctx.time_remaining())
    page, has_more = hits[:args.limit], len(hits) > args.limit
    last = page[-1] if page else None
    return SearchDocumentsOutput(
        items=[SearchItem(document_id=hit.document_id, project_id=hit.project_id, title=hit.title,
                          snippet="" if hit.restricted else " ".join(hit.snippet.split()), restricted=hit.restricted,
                          updated_at=rfc3339(hit.updated_at)) for hit in page],
        next_cursor=cursors.search(scope, After(last.score, last.document_id)) if has_more and last else None,
        has_more=has_more,
    )


async def read(index: Index, args: ReadDocumentInput, ctx: ToolContext) -> ReadDocumentOutput:
    """Up to ``args.max_characters`` of one document of the caller's tenant, from its cursor on."""
    async with _published(ctx):
        cursors = Cursors(await index.cursor_key())
        version, offset = cursors.open_read(args.cursor, args.document_id) if args.cursor is not None else (0, 0)
        passage = await index.read(ctx.principal.tenant, args.document_id, offset, args.max_characters,
                                   timeout=ctx.time_remaining())
        if passage is None:
            raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, f"there is no document {args.document_id}",
                            field="document_id")
        if passage.restricted and READ_RESTRICTED not in ctx.principal.permissions:
            raise ToolError(ErrorCode.PERMISSION_DENIED, f"document {args.document_id} is restricted: reading it "
                            f"needs the permission {READ_RESTRICTED}")
        if args.cursor is not None and version != passage.version:
            raise CursorError(f"document {args.document_id} has changed since this cursor was returned: "
                              "read it again from the start, without a cursor")
        if passage.restricted:
            ctx.add_label(RESTRICTED)
    content = _content(passage)
    end = offset + len(content)
    truncated = end < passage.length
    return ReadDocumentOutput(
        document_id=passage.document_id, project_id=passage.project_id, title=passage.title, content=content,
        truncated=truncated, next_cursor=cursors.read(passage.document_id, passage.version, end) if truncated else None,
        updated_at=rfc3339(passage.updated_at),
    )


def _content(passage: Passage) -> str:
    """The passage's text; cut after its last paragraph, line or word break in its second half if the
    document goes on (so that a part does not end mid-word), unless there is none."""
    text = passage.text
    if passage.offset + len(text) >= passage.length:
        return text
    for separator in ("\n\n", "\n", " "):
        at = text.rfind(separator, len(text) // 2)
        if at != -1:
            return text[:at + len(separator)]
    return text


@asynccontextmanager
async def _published(ctx: ToolContext) -> AsyncIterator[None]:
    """The index's and the cursors' failures as the ``ToolError`` the model reads."""
    try:
        yield
    except IndexUnavailable as exc:
        ctx.logger.warning("document index unavailable (attempt %d): %s", ctx.attempt, exc)
        raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, "the document index is unavailable right now") from None
    except UnknownProject as exc:
        raise ToolError(ErrorCode.INVALID_ARGUMENT, f"there is no project {exc.args[0]!r} in your organization",
                        field="project_id") from None
    except CursorError as exc:
        raise ToolError(ErrorCode.INVALID_ARGUMENT, str(exc), field="cursor") from None
