"""The approval inbox's listener (``approvals_ui.listen``): uvicorn serving ``Inbox`` on the sidecar's own loop.

``ApprovalsInbox.open`` binds the socket (``OSError`` ``cannot listen on approvals_ui.listen …`` if it
cannot be); ``start`` serves in a task of the running loop, with uvicorn's signal handling left to
``serve``; ``stop`` stops taking connections and gives the open ones ``_CLOSE_SECONDS`` to finish.
"""

from __future__ import annotations

import logging
import socket

from sidecar.config import Settings
from sidecar.server.approvals_ui.oidc import OidcSignIn
from sidecar.server.approvals_ui.pages import Inbox
from sidecar.server.approvals_ui.security import Guarded
from sidecar.server.approvals_ui.sessions import Sessions
from sidecar.server.approvals_ui.signin import SignIn
from sidecar.server.approvals_ui.stream_slots import StreamSlots
from sidecar.server.auth import Authenticator
from sidecar.server.http_limits import HttpLimits, bounded_server, listener_limits, start_on
from sidecar.server.listeners import tcp_socket
from sidecar.server.roles import ApprovalDesk, ApprovalGateway, Approvers, Operators

__all__ = ["ApprovalsInbox"]

log = logging.getLogger(__name__)

_CLOSE_SECONDS = 2


class ApprovalsInbox:
    """The inbox of one sidecar: bound by ``open``, then ``start`` and ``stop`` (each once)."""

    def __init__(self, inbox: Inbox, bound: socket.socket, *, host: str, loopback: bool, limits: HttpLimits) -> None:
        self.inbox, self._socket = inbox, bound
        self.url = f"http://{host}:{bound.getsockname()[1]}"
        self._server = bounded_server(Guarded(inbox.app, loopback=loopback), limits, close_seconds=_CLOSE_SECONDS)

    @classmethod
    def open(cls, settings: Settings, approvals: ApprovalGateway) -> ApprovalsInbox:
        """The inbox of ``settings.approvals_ui`` over the pipeline's ``approvals``, deciding as the
        ``ApprovalService`` does (the same ``ApprovalDesk``), its socket bound."""
        ui = settings.approvals_ui
        endpoint = ui.endpoint
        assert endpoint is not None, "approvals_ui.listen is not set"
        limits = listener_limits(settings, "approvals_ui")
        operators, authenticator = Operators(settings.auth), Authenticator(settings.auth)
        oidc = None if ui.oidc is None else OidcSignIn(ui.oidc, authenticator)
        sessions = Sessions(ui.session_seconds, max_open=ui.max_sessions, per_principal=ui.max_sessions_per_principal)
        streams = StreamSlots(max_open=ui.stream_cap, per_principal=ui.max_streams_per_principal)
        inbox = Inbox(ApprovalDesk(approvals, operators), SignIn(settings.auth, authenticator), sessions,
                      approvers=Approvers(operators, ui.approver_roles), secure=not endpoint.is_loopback,
                      page_size=ui.page_size, live_seconds=ui.live_seconds, streams=streams, oidc=oidc)
        host = endpoint.host.removeprefix("[").removesuffix("]")
        bound = tcp_socket(f"approvals_ui.listen {ui.listen}", host, endpoint.port)
        return cls(inbox, bound, host=endpoint.host, loopback=endpoint.is_loopback, limits=limits)

    async def start(self) -> None:
        """Serve on this loop; returns once it accepts connections."""
        await start_on(self._server, self._socket, f"approvals_ui.listen {self.url}")
        log.info("approval inbox listening on %s", self.url)

    async def stop(self) -> None:
        """Stop taking connections; end the live updates' streams; close the open connections within a moment."""
        await self.inbox.closing(_CLOSE_SECONDS)
        await self._server.shutdown()
        self._socket.close()
        await self.inbox.aclose()
