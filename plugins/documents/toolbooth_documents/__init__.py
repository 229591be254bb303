"""Toolbooth documents plugin: ``search_documents`` and ``read_document`` over a full-text index.

Exposed to the sidecar through the ``toolbooth.tools`` entry point ``documents``, which names ``PLUGIN``:
the two tools over the index their settings name (``plugins.config.documents``, ``settings.IndexSettings``),
looked up at each call. ``toolbooth-documents`` (``cli``) fills that index from Markdown and text files.
"""

from __future__ import annotations

from typing import Any

from sidecar.plugin import Plugin, ToolContext, ToolDefinition
from toolbooth_documents.index import Index, open_index
from toolbooth_documents.settings import IndexSettings
from toolbooth_documents.tools import READ_RESTRICTED, build_tools

__all__ = ["PLUGIN", "READ_RESTRICTED", "TOOLS", "IndexSettings", "configured_index", "read_document",
           "search_documents"]


def configured_index(ctx: ToolContext) -> Index:
    """The index the call's settings name (the same object while they name the same one)."""
    return open_index(ctx.plugin_settings(IndexSettings))


TOOLS: list[ToolDefinition[Any, Any]] = build_tools(configured_index)
search_documents, read_document = TOOLS
PLUGIN = Plugin(TOOLS, settings=IndexSettings)
