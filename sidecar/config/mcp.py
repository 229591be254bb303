"""``mcp``: the sidecar's MCP endpoint (Streamable HTTP at ``http://HOST:PORT/mcp``), off unless ``listen`` is set.

``listen`` is one TCP address (``HOST:PORT``, ``[IPV6]:PORT``; port 0 for any free port). Callers
authenticate as over gRPC (``auth``: a bearer JWT in the ``Authorization`` header); in ``dev`` mode
the address must be loopback, as every gRPC one must (checked with the whole ``Settings``).
By default a request is answered with one JSON body unless it asks for progress (a ``progressToken``),
which gets an event stream (``sidecar.server.mcp_transport``); ``json_response: true`` answers every
request as JSON (progress notifications are then dropped). ``http`` bounds its clients' time and number
(``sidecar.config.http``). A session ends after ``session_idle_seconds`` without a request; one principal holds
at most ``max_sessions_per_principal`` sessions (a new one ends their least recently used idle one), fewer than
``max_sessions``, all principals' together (``sidecar.server.mcp_sessions``). An ``initialize`` request's body
is at most ``max_initialize_bytes`` (at most ``limits.max_message_bytes``, checked with the whole ``Settings``), as
its session keeps its params. Serving it needs the ``mcp`` extra (``sidecar.config.endpoints``).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from sidecar.config.base import Section
from sidecar.config.http import HttpListenerSettings
from sidecar.config.listen import Endpoint, one_tcp_endpoint

__all__ = ["MCP_PATH", "McpSettings"]

MCP_PATH = "/mcp"


class McpSettings(Section):
    """Where the MCP endpoint listens (``None``: nowhere, the default)."""

    listen: str | None = None
    # Answer every POST with one JSON body, even one asking for progress (its notifications are dropped); by
    # default only a request with a progressToken gets an event stream.
    json_response: bool = False
    http: HttpListenerSettings = HttpListenerSettings()
    session_idle_seconds: float = Field(default=600, gt=0, le=86_400)  # a session without a request ends then
    max_sessions: int = Field(default=1000, gt=0, le=1_000_000)  # open sessions of all principals together
    max_sessions_per_principal: int = Field(default=16, gt=0)  # past it, their least recently used idle one ends
    # A session keeps its initialize request's params for its life: a bigger initialize is refused (413).
    max_initialize_bytes: int = Field(default=64 * 1024, gt=0)

    @field_validator("listen")
    @classmethod
    def _one_tcp_address(cls, value: str | None) -> str | None:
        if value is not None:
            one_tcp_endpoint(value, "the MCP endpoint")
        return value

    @model_validator(mode="after")
    def _sessions_fit(self) -> McpSettings:
        if self.max_sessions_per_principal >= self.max_sessions:
            raise ValueError(f"max_sessions_per_principal ({self.max_sessions_per_principal}) must be below "
                             f"max_sessions ({self.max_sessions}), or one principal could take every session")
        return self

    @property
    def endpoint(self) -> Endpoint | None:
        """The host and port to listen on, ``None`` when the endpoint is off."""
        return None if self.listen is None else one_tcp_endpoint(self.listen, "the MCP endpoint")
