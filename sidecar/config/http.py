"""``mcp.http`` and ``approvals_ui.http``: how long an HTTP listener waits for its clients and how many it holds.

The same keys for both listeners (``sidecar.server.http_limits`` applies them): a request's head must
arrive within ``header_timeout_seconds`` and the whole request, body included, within
``request_timeout_seconds`` (from the connection, or from the first byte after an idle keep-alive); a
connection between requests is closed after ``idle_timeout_seconds`` (whole seconds: uvicorn's own
keep-alive timer); a listener holds at most ``max_connections`` at once and answers one more with 503.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from sidecar.config.base import Section

__all__ = ["HttpListenerSettings"]


class HttpListenerSettings(Section):
    """The bounds one HTTP listener puts on its clients."""

    header_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    request_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    idle_timeout_seconds: int = Field(default=5, ge=1, le=3600)
    max_connections: int = Field(default=256, ge=1, le=65536)

    @model_validator(mode="after")
    def _head_within_request(self) -> HttpListenerSettings:
        if self.header_timeout_seconds > self.request_timeout_seconds:
            raise ValueError(f"header_timeout_seconds ({self.header_timeout_seconds:g}) may not exceed "
                             f"request_timeout_seconds ({self.request_timeout_seconds:g}), which bounds the "
                             "whole request, head included")
        return self
