"""MCP sessions for tests: the SDK's own ``ClientSession`` over Streamable HTTP or over a ``mcp-stdio`` process."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any, TextIO

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from sidecar.contract import ToolResult


def http_client(token: str | None = None, headers: Mapping[str, str] | None = None) -> httpx2.AsyncClient:
    """An HTTP client with the bearer ``token`` (if any) and the timeouts MCP's event streams need."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    return httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30, read=300))


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with the endpoint at ``url``."""
    async with http_client(token) as http, streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def stdio_session(*args: str, env: Mapping[str, str] | None = None,
                        errlog: TextIO = sys.stderr) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with ``toolbooth mcp-stdio ARGS``, started by the SDK's stdio client (which
    passes the child only the usual variables, such as ``PATH`` and ``HOME``, and ``env``)."""
    parameters = StdioServerParameters(command=sys.executable, args=["-m", "sidecar", "mcp-stdio", *args],
                                       env=dict(env or {}))
    async with stdio_client(parameters, errlog=errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def typed(structured: Any) -> ToolResult:
    """A call's ``structuredContent`` read back as the typed result it is."""
    return ToolResult.model_validate(structured)
