"""The sidecar's MCP endpoint: Streamable HTTP at ``http://HOST:PORT/mcp`` (``mcp.listen``), in its own event loop.

The MCP SDK's session manager serves the protocol (``sidecar.mcp.server`` over the pipeline), each POST
answered as JSON unless it asks for progress (``sidecar.server.mcp_transport``); uvicorn
serves HTTP on the sidecar's loop, with its signal handling left to ``serve``. Every request to
``/mcp`` is authenticated first by the same ``Authenticator`` as gRPC calls (the bearer JWT of its
``Authorization`` header; dev mode: the static principal, on loopback only) and refused with 401
and the authenticator's constant message otherwise. The principal of each request is the one its
calls run as; a session can only be used by the principal that opened it (the SDK answers 404 to
another), and each principal holds a few sessions at most (``sidecar.server.mcp_sessions``). A request's
trace headers (``traceparent``, ``tracestate``) are the trace its calls continue when the sidecar traces. On
a loopback address the SDK's DNS-rebinding protection is on (``Host`` and ``Origin`` must name the loopback
host), so a web page cannot reach a dev-mode endpoint through the browser.

``McpEndpoint.stop`` stops taking connections, lets the calls in flight finish within the grace,
then ends the sessions (their open event streams with them) and closes what is left.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar.config import MCP_PATH, Settings
from sidecar.contract import CallRequest, Principal, ToolListing, ToolResult
from sidecar.errors import AuthenticationError
from sidecar.faults import classify
from sidecar.mcp.server import Context, SendProgress, build_server
from sidecar.server.auth import Authenticator
from sidecar.server.gateway import ToolGateway
from sidecar.server.http_drain import InFlight
from sidecar.server.http_faults import HTTP_STATUSES
from sidecar.server.http_limits import HttpLimits, bounded_server, listener_limits
from sidecar.server.listeners import tcp_socket
from sidecar.server.mcp_sessions import Sessions
from sidecar.telemetry.propagation import continuing, trace_headers

__all__ = ["McpEndpoint", "principal_of"]

log = logging.getLogger(__name__)

_PRINCIPAL = "toolbooth.principal"  # the key of the request's principal in the ASGI scope's state
_TRACE = "toolbooth.trace"  # and of its trace headers
_CLOSE_SECONDS = 1  # once the sessions ended, what is left of the connections gets this long to close
_LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]


class McpEndpoint:
    """The MCP endpoint of one sidecar: bound by ``open``, then ``start`` and ``stop`` (each once)."""

    def __init__(self, app: ASGIApp, manager: StreamableHTTPSessionManager, bound: socket.socket, *,
                 host: str, grace: float, limits: HttpLimits) -> None:
        self._manager, self._socket, self._grace, self._in_flight = manager, bound, grace, InFlight(app)
        port = bound.getsockname()[1]
        self.url = f"http://{host}:{port}{MCP_PATH}"
        self._server = bounded_server(self._in_flight, limits, close_seconds=_CLOSE_SECONDS, json_errors=True)
        self._run: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.draining = asyncio.Event()  # set once a stop takes no new connections and waits for the calls in flight

    @classmethod
    def open(cls, settings: Settings, gateway: ToolGateway) -> McpEndpoint:
        """The endpoint of ``settings.mcp``, its socket bound (``OSError`` ``cannot listen on …`` if it cannot be)."""
        endpoint = settings.mcp.endpoint
        assert endpoint is not None, "mcp.listen is not set"
        limits = listener_limits(settings, "mcp")
        host = endpoint.host.removeprefix("[").removesuffix("]")
        security = None
        if endpoint.is_loopback:
            security = TransportSecuritySettings(allowed_hosts=_LOOPBACK_HOSTS,
                                                 allowed_origins=[f"http://{h}" for h in _LOOPBACK_HOSTS])
        server = build_server(lambda ctx: _CallerTools(gateway, principal_of(ctx), _trace_headers_of(ctx)))
        manager = Sessions(server, settings.mcp, security_settings=security,
                           max_request_body_size=settings.limits.max_message_bytes)
        authenticated = _Authenticated(StreamableHTTPASGIApp(manager), Authenticator(settings.auth))
        app = Starlette(routes=[Route(MCP_PATH, endpoint=authenticated)])
        app.router.redirect_slashes = False  # /mcp/ is not found, never redirected to where Host says
        bound = tcp_socket(f"mcp.listen {settings.mcp.listen}", host, endpoint.port)
        return cls(app, manager, bound, host=endpoint.host, grace=settings.server.shutdown_grace_seconds,
                   limits=limits)

    async def start(self) -> None:
        """Serve in a task of this loop; returns once it accepts connections."""
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._run = asyncio.create_task(self._serve(started), name="toolbooth-mcp")
        await asyncio.wait([started, self._run], return_when=asyncio.FIRST_COMPLETED)
        if self._run.done():
            self._socket.close()
            self._run.result()  # start-up failed: raise its error
        log.info("MCP (Streamable HTTP) listening on %s", self.url)

    async def stop(self) -> None:
        """Let calls in flight finish within the grace, end the sessions, close the connections."""
        self._stop.set()
        if self._run is not None:
            await self._run
        self._socket.close()

    async def _serve(self, started: asyncio.Future[None]) -> None:
        # The session manager's task group lives in this one task, from start to stop.
        async with self._manager.run():
            await self._server.startup(sockets=[self._socket])
            started.set_result(None)
            await self._stop.wait()
            self.draining.set()  # its waiters run once drain has closed the listening sockets (no await before)
            await self._in_flight.drain(self._server, self._grace, "MCP endpoint")
        await self._server.shutdown()


def principal_of(ctx: Context) -> Principal:
    """The authenticated principal of the HTTP request that carried this MCP request."""
    request: Any = ctx.request
    principal = None if request is None else request.scope.get("state", {}).get(_PRINCIPAL)
    if not isinstance(principal, Principal):
        raise AuthenticationError("missing bearer token")  # not behind _Authenticated: refuse, never guess
    return principal


def _trace_headers_of(ctx: Context) -> dict[str, str]:
    """The trace headers of the HTTP request that carried this MCP request."""
    request: Any = ctx.request
    headers = None if request is None else request.scope.get("state", {}).get(_TRACE)
    return headers if isinstance(headers, dict) else {}


class _CallerTools:
    """The pipeline as one principal calls it, continuing the trace of the request."""

    def __init__(self, gateway: ToolGateway, principal: Principal, trace: dict[str, str]) -> None:
        self._gateway, self._principal, self._trace = gateway, principal, trace

    async def list_tools(self, *, conversation_id: str | None = None) -> ToolListing:
        return await self._gateway.list_tools(self._principal, conversation_id=conversation_id)

    async def execute(self, request: CallRequest, *, progress: SendProgress | None = None) -> ToolResult:
        with continuing(self._trace):
            if progress is None:
                return await self._gateway.execute(self._principal, request)
            return await self._gateway.execute_streamed(self._principal, request, progress)


class _Authenticated:
    """ASGI: authenticate each request with the sidecar's authenticator, or answer 401 (``HTTP_STATUSES``)."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self._app, self._authenticator = app, authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metadata = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        try:
            principal = await self._authenticator.authenticate(metadata)
        except AuthenticationError as exc:
            fault = classify(exc)
            challenge = f'Bearer error="invalid_token", error_description="{fault.message}"'
            response = JSONResponse({"error": "invalid_token", "error_description": fault.message},
                                    status_code=HTTP_STATUSES[fault.kind], headers={"WWW-Authenticate": challenge})
            await response(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[_PRINCIPAL], state[_TRACE] = principal, trace_headers(metadata)
        # The SDK binds a session to the principal that opened it (client_id, issuer, subject).
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=principal.id, scopes=[],
                                                      subject=principal.id, claims={"iss": principal.tenant}))
        await self._app(scope, receive, send)

