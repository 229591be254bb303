"""How the sidecar's HTTP listeners that read request bodies (MCP, the approval inbox, HTTP/JSON) bound their
clients, so that no number of slow or idle clients can exhaust the process.

uvicorn bounds only the idle time after a response (``timeout_keep_alive``): it starts no timer before a
request's head has arrived, so a client that sends part of a header holds its connection, and a file
descriptor, for ever. ``bounded_server`` serves an app with ``_BoundedH11``, uvicorn's h11 protocol with
the bounds of ``HttpLimits`` added. It is pinned whatever else is installed (``http="auto"`` would take
httptools, which bounds no header's size), and WebSocket upgrades are off (neither listener has any):

- a request's head must arrive within ``header_timeout_seconds`` of the connection (or of the first byte
  after an idle keep-alive), the whole request, body included, within ``request_timeout_seconds``; past
  it the connection is closed, with a ``408`` when no request had arrived;
- between requests a connection stays ``idle_timeout_seconds``;
- a listener holds at most ``max_connections``: one more is answered ``503`` and closed at once, and
  those it holds are served as before;
- a head may hold ``auth.max_metadata_bytes`` (the largest token, ``auth.max_token_bytes``, and 8 KiB
  besides) before it is complete (h11's ``max_incomplete_event_size``): a token the authenticator accepts
  is never refused by its size here;
- a request h11 cannot read (two ``Content-Length`` headers, a negative one, an HTTP/0.9 line, a head past
  its bound) is answered ``400`` and the connection closed: with a typed error (``INVALID_REQUEST``, as
  every answer of HTTP/JSON) on a listener serving JSON (``json_errors``), as uvicorn's plain text else.

Whether the HTTP listeners' caps together could take more than half of the process's file descriptors is
checked before any listener opens (``sidecar.server.http_guard.check_descriptors``). The records of a refused
connection, uvicorn's warnings and asyncio's accept errors are rate-limited (``sidecar.telemetry.repeats``).
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import ClassVar

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from sidecar.config import Settings
from sidecar.config.http import HttpListenerSettings
from sidecar.server.http_guard import Deadline, expire, limit_flood_records, refused

__all__ = ["HttpLimits", "bounded_server", "listener_limits", "start_on"]


@dataclass(frozen=True)
class HttpLimits:
    """The bounds of one listener: its section's ``http`` keys and the largest head it reads."""

    listener: str  # its section: mcp, approvals_ui, http_json
    settings: HttpListenerSettings
    max_head_bytes: int


def listener_limits(settings: Settings, listener: str) -> HttpLimits:
    """The bounds of the listener of the section ``listener`` (one with ``HttpListenerSettings``)."""
    bounds = getattr(settings, listener).http
    assert isinstance(bounds, HttpListenerSettings), f"{listener} reads no request bodies"
    return HttpLimits(listener, bounds, settings.auth.max_metadata_bytes)


_INVALID = json.dumps({"error": {"code": "INVALID_REQUEST", "message": "the request is not valid HTTP/1.1",
                                  "retryable": False}}).encode()


def bounded_server(app: ASGIApp, limits: HttpLimits, *, close_seconds: int,
                   json_errors: bool = False) -> uvicorn.Server:
    """A uvicorn server of ``app`` within ``limits`` (lifespan off, no access log, no ``Server`` header); a
    graceful shutdown gives open connections ``close_seconds``; ``json_errors``: a request it cannot read is
    answered with a typed JSON error."""
    limit_flood_records("uvicorn.error")
    class Bounded(_BoundedH11):
        """``_BoundedH11`` within this listener's limits."""

    Bounded.limits, Bounded.json_errors = limits, json_errors
    config = uvicorn.Config(app, http=Bounded, ws="none", lifespan="off", log_config=None, access_log=False,
                            server_header=False, timeout_graceful_shutdown=close_seconds,
                            timeout_keep_alive=limits.settings.idle_timeout_seconds,
                            h11_max_incomplete_event_size=limits.max_head_bytes)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    return server


async def start_on(server: uvicorn.Server, bound: socket.socket, where: str) -> None:
    """Start ``server`` on ``bound``, on this loop; returns once it accepts connections. ``OSError`` ``cannot listen
    on WHERE`` (``bound`` closed) if it cannot."""
    try:
        await server.startup(sockets=[bound])
    except BaseException:
        bound.close()
        raise
    if server.should_exit:  # uvicorn logs why and asks to exit instead of raising
        bound.close()
        raise OSError(f"cannot listen on {where}")


class _BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's arrival and a cap on the listener's connections."""

    limits: ClassVar[HttpLimits]
    json_errors: ClassVar[bool]
    _refused = False
    _began: float | None = None  # when the request being received began to arrive
    _deadline: Deadline

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        settings = self.limits.settings
        if refused(transport, self.limits.listener, len(self.connections), settings.max_connections):
            self._refused = True
            return
        super().connection_made(transport)
        self._deadline = Deadline(self._expire)
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._deadline.stop()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def send_400_response(self, msg: str) -> None:
        """Answer a request h11 cannot read (``msg``: uvicorn's text) and close the connection."""
        if not self.json_errors:
            super().send_400_response(msg)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_INVALID)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=_INVALID),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _track(self) -> None:
        """Keep the deadline of the request arriving now (its head, or its body); none while none is."""
        state, settings = self.conn.their_state, self.limits.settings
        if self.transport.is_closing():
            bound = None
        elif state is h11.IDLE and self.timeout_keep_alive_task is None:  # not idle between requests: a head is due
            bound = settings.header_timeout_seconds
        elif state is h11.SEND_BODY:
            bound = settings.request_timeout_seconds
        else:
            bound = None
        if bound is None:
            self._began = None
            self._deadline.stop()
            return
        if self._began is None:
            self._began = self.loop.time()
        if self._deadline.when != self._began + bound:  # armed once per phase, not once per read
            self._deadline.arm(self._began + bound)

    def _expire(self) -> None:
        expire(self.transport, self.limits.listener, answering=self.conn.their_state is not h11.IDLE)
