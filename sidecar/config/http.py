"""``mcp.http``, ``approvals_ui.http`` and ``metrics.http``: how long an HTTP listener waits for its clients and how
many it holds.

The same keys for every listener (``sidecar.server.http_limits`` applies them to MCP and the inbox,
``sidecar.server.http_guard`` to metrics): a request's head must arrive within ``header_timeout_seconds``
(from the connection, or from its first byte after an idle keep-alive); a connection between requests is
closed after ``idle_timeout_seconds`` (whole seconds: uvicorn's own keep-alive timer); a listener holds at
most ``max_connections`` at once and answers one more with 503. MCP and the inbox read request bodies: the
whole request, body included, must arrive within ``request_timeout_seconds``. Metrics' server (aiohttp)
also closes a connection whose request has not arrived at its keep-alive timer: a head to metrics is due
within the smaller of ``header_timeout_seconds`` and ``idle_timeout_seconds``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from sidecar.config.base import Section

__all__ = ["HttpConnectionSettings", "HttpListenerSettings"]


class HttpConnectionSettings(Section):
    """The bounds one HTTP listener puts on its connections."""

    header_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    idle_timeout_seconds: int = Field(default=5, ge=1, le=3600)
    max_connections: int = Field(default=256, ge=1, le=65536)


class HttpListenerSettings(HttpConnectionSettings):
    """The bounds of a listener that reads request bodies: those on its connections and on a whole request."""

    request_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _head_within_request(self) -> HttpListenerSettings:
        if self.header_timeout_seconds > self.request_timeout_seconds:
            raise ValueError(f"header_timeout_seconds ({self.header_timeout_seconds:g}) may not exceed "
                             f"request_timeout_seconds ({self.request_timeout_seconds:g}), which bounds the "
                             "whole request, head included")
        return self
