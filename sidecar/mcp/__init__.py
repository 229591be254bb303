"""Toolbooth over the Model Context Protocol (the ``mcp`` extra: ``pip install 'toolbooth[mcp]'``).

``server`` builds the MCP server over any ``Tools`` (the pipeline in the sidecar, a gRPC client in
``toolbooth mcp-stdio``); ``meta`` reads a call's ``_meta`` keys; ``results`` writes a result as MCP's
``CallToolResult``. The tool objects themselves are ``sidecar.api.schemas.mcp_tool``'s, so that
``toolbooth tools export --format mcp`` needs no MCP package. Depends only on ``sidecar.api``,
``sidecar.contract`` and ``sidecar.errors``: never on the server, the pipeline or the client.
"""

from __future__ import annotations

__all__: list[str] = []
