"""Toolbooth documents plugin: ``search_documents`` and ``read_document`` over a full-text index.

Exposed to the sidecar through the ``toolbooth.tools`` entry point ``documents``, which names ``TOOLS``:
the two tools over the index the ``TBDOCS_*`` environment variables configure (``settings``), looked up
at each call. ``toolbooth-documents`` (``cli``) fills that index from Markdown and text files.
"""

from __future__ import annotations

from typing import Any

from sidecar.plugin import ToolDefinition
from toolbooth_documents.index import Index, open_index
from toolbooth_documents.settings import IndexSettings
from toolbooth_documents.tools import READ_RESTRICTED, build_tools

__all__ = ["READ_RESTRICTED", "TOOLS", "configured_index", "read_document", "search_documents"]


def configured_index() -> Index:
    """The index the environment names now (the same object while it names the same one)."""
    return open_index(IndexSettings.from_env())


TOOLS: list[ToolDefinition[Any, Any]] = build_tools(configured_index)
search_documents, read_document = TOOLS
