"""``http_json``: the sidecar's HTTP/JSON endpoint (``POST http://HOST:PORT/v1/call``), off unless ``listen`` is set.

``listen`` is one TCP address (``HOST:PORT``, ``[IPV6]:PORT``; port 0 for any free port). Callers
authenticate as over gRPC (``auth``: a bearer JWT in the ``Authorization`` header); in ``dev`` mode the
address must be loopback (checked with the whole ``Settings``). A request's body is at most
``limits.max_message_bytes``; ``http`` bounds its clients' time and number (``sidecar.config.http``; 64
connections by default). It keeps no state between requests, so with ``server.workers`` every worker serves it
on the same port. Serving it needs the ``http-json`` extra (``sidecar.config.endpoints``).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from sidecar.config.base import Section
from sidecar.config.http import HttpListenerSettings
from sidecar.config.listen import Endpoint, one_tcp_endpoint

__all__ = ["CALL_PATH", "HttpJsonSettings"]

CALL_PATH = "/v1/call"
_WHAT = "the HTTP/JSON endpoint"


class HttpJsonSettings(Section):
    """Where the HTTP/JSON endpoint listens (``None``: nowhere, the default)."""

    listen: str | None = None
    # 64 connections by default: with every listener on at its default cap, they fit half of the usual 1024 files
    http: HttpListenerSettings = Field(default_factory=lambda: HttpListenerSettings(max_connections=64))

    @field_validator("listen")
    @classmethod
    def _one_tcp_address(cls, value: str | None) -> str | None:
        if value is not None:
            one_tcp_endpoint(value, _WHAT)
        return value

    @property
    def endpoint(self) -> Endpoint | None:
        """The host and port to listen on, ``None`` when the endpoint is off."""
        return None if self.listen is None else one_tcp_endpoint(self.listen, _WHAT)
