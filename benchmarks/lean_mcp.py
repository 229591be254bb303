"""A lean MCP client for benchmarks: Streamable HTTP JSON-RPC over one aiohttp keep-alive connection pool.

The MCP SDK's ``ClientSession`` spends several ms of CPU per call (pydantic models of every message, its
SSE parser, a JSON Schema validation of each result), which on a small machine is more than the server
spends answering. This client does only what the protocol asks of a client, so a benchmark that shares
its CPUs with the server measures the server:

- the handshake: ``initialize`` (protocol ``2025-11-25``), the ``Mcp-Session-Id`` the server assigns,
  then ``notifications/initialized``; every later request carries the session id and
  ``MCP-Protocol-Version``; ``close`` ends the session with ``DELETE``;
- the headers the SDK's client sends (``Accept: application/json, text/event-stream``,
  ``Content-Type: application/json``) and, when a token is given, ``Authorization: Bearer <token>``;
- each reply read to its end (so the connection is reused), as a JSON body or as an event stream whose
  ``message`` events are JSON-RPC messages: notifications are collected, the response with the
  request's id is the answer.

It checks nothing about a result itself: ``call_tool`` returns the JSON-RPC ``result`` object and the
notifications that came with it, and the caller checks its ``structuredContent``.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import aiohttp

__all__ = ["PROTOCOL_VERSION", "LeanMcpClient", "McpReplyError", "parse_reply"]

PROTOCOL_VERSION = "2025-11-25"
_SESSION_HEADER = "mcp-session-id"
_VERSION_HEADER = "mcp-protocol-version"


class McpReplyError(Exception):
    """A reply that is not the JSON-RPC response asked for: an HTTP error, a JSON-RPC error, a broken body."""


def parse_reply(content_type: str, body: bytes, request_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``result`` of the response to ``request_id`` in a JSON or event-stream body, and the notifications
    sent before it; ``McpReplyError`` if there is no such response or it is an error."""
    if content_type.startswith("text/event-stream"):
        messages = [json.loads(data) for data in _event_data(body.decode())]
    elif content_type.startswith("application/json"):
        messages = [json.loads(body)]
    else:
        raise McpReplyError(f"unexpected content type {content_type!r}")
    notifications = [message for message in messages if "id" not in message]
    response = next((message for message in messages if message.get("id") == request_id), None)
    if response is None:
        raise McpReplyError(f"no response to request {request_id} in the reply")
    if "error" in response:
        raise McpReplyError(f"JSON-RPC error {response['error']}")
    return response["result"], notifications


def _event_data(stream: str) -> list[str]:
    """The data of each ``message`` event of an event stream (events without data, such as primes, skipped)."""
    found = []
    for block in stream.replace("\r\n", "\n").split("\n\n"):
        event, data = "message", []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        if event == "message" and data and any(data):
            found.append("\n".join(data))
    return found


class LeanMcpClient:
    """One MCP session with the endpoint at ``url``: ``await open()``, calls, ``await close()``."""

    def __init__(self, url: str, *, token: str | None = None, connections: int = 100) -> None:
        self._url = url
        self._headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                           timeout=aiohttp.ClientTimeout(total=300))
        self._ids = itertools.count(1)
        self.server_info: dict[str, Any] = {}

    async def open(self) -> None:
        """The handshake: ``initialize``, then ``notifications/initialized`` in the session it opened."""
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": "initialize",
                "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                           "clientInfo": {"name": "toolbooth-bench", "version": "1"}}}
        async with self._http.post(self._url, data=json.dumps(body), headers=self._headers) as response:
            reply = await response.read()
            if response.status != 200:
                raise McpReplyError(f"initialize: HTTP {response.status} {reply[:200]!r}")
            session_id = response.headers.get(_SESSION_HEADER)
            result, _ = parse_reply(response.content_type, reply, request_id)
        if session_id is None:
            raise McpReplyError("initialize: no Mcp-Session-Id in the reply")
        if result.get("protocolVersion") != PROTOCOL_VERSION:
            raise McpReplyError(f"initialize: the server chose protocol {result.get('protocolVersion')!r}")
        self.server_info = result.get("serverInfo", {})
        self._headers[_SESSION_HEADER] = session_id
        self._headers[_VERSION_HEADER] = PROTOCOL_VERSION
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self._http.post(self._url, data=json.dumps(initialized), headers=self._headers) as response:
            await response.read()
            if response.status != 202:
                raise McpReplyError(f"notifications/initialized: HTTP {response.status}")

    async def request(self, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send one request in the session; its ``result`` and the notifications that came before it."""
        request_id = next(self._ids)
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        async with self._http.post(self._url, data=body, headers=self._headers) as response:
            reply = await response.read()
            if response.status != 200:
                raise McpReplyError(f"{method}: HTTP {response.status} {reply[:200]!r}")
            return parse_reply(response.content_type, reply, request_id)

    async def call_tool(self, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``tools/call``: the ``CallToolResult`` as JSON and the notifications (progress) sent before it."""
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        return await self.request("tools/call", params)

    async def close(self) -> None:
        """End the session (``DELETE``) and close the connections."""
        try:
            if _SESSION_HEADER in self._headers:
                async with self._http.delete(self._url, headers=self._headers) as response:
                    await response.read()
        finally:
            await self._http.close()

    async def __aenter__(self) -> LeanMcpClient:
        try:
            await self.open()
        except BaseException:
            await self._http.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
