"""Toolbooth demo plugin: the tools ``examples/agent_loop.py`` shows besides ``calculate``.

``index_documents`` reports its progress, ``save_note`` is a write (its calls carry an idempotency key),
``send_message`` is external and irreversible, so the default approval policy holds it for a person's
approval. Notes and messages are kept in the sidecar's memory (``NOTES``, ``OUTBOX``): a demo, not a tool
to deploy. Exposed through the ``toolbooth.tools`` entry point ``demo``, which names ``TOOLS``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sidecar.plugin import SideEffect, ToolContext, ToolDefinition, tool

__all__ = ["NOTES", "OUTBOX", "TOOLS", "index_documents", "save_note", "send_message"]

NOTES: list[str] = []
OUTBOX: list[str] = []
_ids = itertools.count(1)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IndexInput(_Closed):
    count: int = Field(ge=1, le=50, description="how many documents to index")


class Indexed(BaseModel):
    indexed: int


class NoteInput(_Closed):
    text: str = Field(min_length=1, max_length=1000)


class Saved(BaseModel):
    note_id: int
    text: str


class MessageInput(_Closed):
    to: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=1000)


class Sent(BaseModel):
    message_id: int
    to: str


@tool(name="index_documents", version="1.0.0", side_effect=SideEffect.NONE, timeout=30,
      description="Index COUNT documents (a demo: about 0.1 s each), reporting progress after each.")
async def index_documents(args: IndexInput, ctx: ToolContext) -> Indexed:
    """Pretend to index ``count`` documents, reporting after each one."""
    for done in range(1, args.count + 1):
        await asyncio.sleep(0.1)  # the work of one document
        await ctx.report_progress(done, total=args.count, message=f"indexed doc-{done}")
    return Indexed(indexed=args.count)


@tool(name="save_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5,
      description="Save a note; returns its id.")
async def save_note(args: NoteInput, ctx: ToolContext) -> Saved:
    """Append the note to ``NOTES``: one entry per real execution."""
    NOTES.append(args.text)
    return Saved(note_id=next(_ids), text=args.text)


@tool(name="send_message", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE, timeout=5,
      description="Send a message to someone outside; it cannot be taken back.")
async def send_message(args: MessageInput, ctx: ToolContext) -> Sent:
    """Append the message to ``OUTBOX``: one entry per message really sent."""
    OUTBOX.append(f"{args.to}: {args.text}")
    return Sent(message_id=next(_ids), to=args.to)


TOOLS: list[ToolDefinition[Any, Any]] = [index_documents, save_note, send_message]
