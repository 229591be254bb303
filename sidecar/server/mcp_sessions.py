"""How many MCP sessions the endpoint keeps, and for whom: a few per principal, so that nobody can take them all.

The MCP SDK's session manager caps the sessions of everyone together (``mcp.max_sessions``; past it, a new
session is answered ``503``) and ends one after ``mcp.session_idle_seconds`` without a request. Alone, that let
one principal open every session, and every other caller was refused until theirs expired. ``Sessions`` also
holds each principal (their id and tenant) to ``mcp.max_sessions_per_principal``, fewer than the cap of all.

A principal who opens one more session ends their own least recently used idle session (no request in flight,
no event stream open), exactly as if it had expired: it answers ``404`` from then on, which MCP tells a client
to meet by opening a new session. An agent that loses track of its sessions (no ``DELETE`` when it stops, a
crash) so keeps working and never locks itself out. Only when all of that principal's sessions are busy is the
new one refused, ``429`` with a JSON-RPC error: another principal's sessions are never touched.

The SDK admits a session for any request without a session id, before reading it. An old session is ended only
once the new one is accepted (its opening request answered below 400): a request that opens none (a body that
is no JSON-RPC message, an ``initialize`` too large, a GET) ends nothing. Meanwhile, admission counts each idle
session as spare once only, and a session that will end one of its principal's may pass ``mcp.max_sessions``
for as long as its opening request takes (it takes the place of the one it ends).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import INTERNAL_ERROR
from starlette.types import Message, Receive, Scope, Send

from sidecar.config.mcp import McpSettings
from sidecar.mcp import envelope
from sidecar.server.mcp_transport import SessionManager, error_response

__all__ = ["Sessions"]

log = logging.getLogger(__name__)

_ALL_BUSY = "Too many open sessions for this principal, each with a request in flight; end one (DELETE) or retry"


_Principal = tuple[str, str | None, str | None]


class _AllBusy(Exception):
    """The principal holds their most sessions and every one is busy."""


class Sessions(SessionManager):
    """The endpoint's session manager: at most ``per_principal`` sessions for each principal."""

    def __init__(self, server: Server[Any], settings: McpSettings, *,
                 security_settings: TransportSecuritySettings | None, max_request_body_size: int) -> None:
        super().__init__(server, security_settings=security_settings, json_response=settings.json_response,
                         max_request_body_size=max_request_body_size, max_sessions=settings.max_sessions,
                         session_idle_timeout=settings.session_idle_seconds,
                         max_initialize_bytes=settings.max_initialize_bytes)
        self._per_principal = settings.max_sessions_per_principal
        self._giving_way: set[str] = set()  # new sessions that end one of their principal's once accepted
        self._held: dict[_Principal, set[str]] = {}  # each principal's sessions, so none is found by a scan

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super()._handle_stateful_request(scope, receive, send)
        except _AllBusy:  # raised before anything was answered or opened
            await error_response(envelope.error(INTERNAL_ERROR, _ALL_BUSY), status_code=429)(scope, receive, send)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        # Called under the SDK's session-creation lock, so the count cannot change meanwhile.
        if requestor is None:
            return super()._admit_session(requestor)
        held = self._held.get(_principal(requestor), set())
        gives_way = len(held) >= self._per_principal
        if gives_way and len(_idle(held, self._server_instances)) <= len(self._giving_way & held):
            log.warning("MCP: refused a new session of %s: its %d sessions (mcp.max_sessions_per_principal) are "
                        "all busy", _named(requestor), len(held))
            raise _AllBusy
        cap_of_all = self.max_sessions
        if gives_way:
            self.max_sessions = None  # it takes the place of the one it will end
        try:
            transport = super()._admit_session(requestor)
        finally:
            self.max_sessions = cap_of_all
        if transport is not None:
            assert transport.mcp_session_id is not None
            self._held.setdefault(_principal(requestor), held).add(transport.mcp_session_id)
            if gives_way:
                self._giving_way.add(transport.mcp_session_id)
        return transport

    async def _serve_opening_request(self, http_transport: StreamableHTTPServerTransport, scope: Scope,
                                     receive: Receive, send: Send) -> None:
        session_id = http_transport.mcp_session_id
        assert session_id is not None

        async def accepted(message: Message) -> None:
            owner = self._session_owners.get(session_id)
            if message["type"] == "http.response.start" and message["status"] < 400 \
                    and session_id in self._giving_way and owner is not None:
                self._giving_way.discard(session_id)
                self._end_least_recently_used(owner)
            await send(message)

        try:
            await super()._serve_opening_request(http_transport, scope, receive, accepted)
        finally:
            self._giving_way.discard(session_id)

    def _end_least_recently_used(self, requestor: AuthorizationContext) -> None:
        """End the principal's least recently used idle session, for the new one just accepted."""
        held = self._held[_principal(requestor)]
        idle = _idle(held, self._server_instances)
        if not idle:  # each became busy since the new one was admitted: they hold one more for now
            return
        _, oldest = min(idle)
        self._unheld(oldest)
        transport = self._server_instances.pop(oldest)  # forgotten at once: its id answers 404 from now on
        self._session_owners.pop(oldest, None)
        assert transport.idle_scope is not None
        transport.idle_scope.cancel()  # its server task ends it, as when it expires
        log.info("MCP: ended the least recently used idle session of %s for a new one (it holds %d, "
                 "mcp.max_sessions_per_principal)", _named(requestor), len(held))

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        self._unheld(session_id)
        await super()._discard_session(session_id, transport)

    def _unheld(self, session_id: str) -> None:
        """Drop ``session_id`` from its principal's sessions (before the SDK forgets whose it is)."""
        owner = self._session_owners.get(session_id)
        if owner is not None and (held := self._held.get(key := _principal(owner))) is not None:
            held.discard(session_id)
            if not held:
                del self._held[key]


def _principal(requestor: AuthorizationContext) -> _Principal:
    """What identifies a principal, as the SDK compares them."""
    return requestor["client_id"], requestor["issuer"], requestor["subject"]


def _idle(sessions: set[str], transports: dict[str, StreamableHTTPServerTransport]) -> list[tuple[float, str]]:
    """The idle ones of ``sessions``, each with when it expires."""
    return [(until, session) for session in sessions if (until := _idle_until(transports[session])) is not None]


def _idle_until(transport: StreamableHTTPServerTransport) -> float | None:
    """When an idle session expires (it is the least recently used whose time comes first); ``None`` while a
    request is in flight (the SDK then holds its expiry at infinity) or before its server task started."""
    scope = transport.idle_scope
    if scope is None or scope.cancel_called or math.isinf(scope.deadline):
        return None
    return scope.deadline


def _named(requestor: AuthorizationContext) -> str:
    return f"principal {requestor['client_id']!r} of tenant {requestor['issuer']!r}"
