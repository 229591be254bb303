"""How the MCP endpoint answers a POST: one JSON body, or an event stream only when progress was asked for.

Streamable HTTP lets a server answer each POSTed request either way. An event stream costs the sidecar
about twice what a JSON body costs (a task per response, chunked framing) and is needed only to send
something before the result: here, ``notifications/progress`` for a ``tools/call`` whose ``_meta`` carries
a ``progressToken`` (``sidecar.mcp.server``), the only messages this server ever sends about a request
besides its response (it sends no log messages and no server-to-client requests). So each POST whose
JSON-RPC request carries no ``progressToken`` is answered with its JSON response; one that carries a
token gets an event stream with the progress notifications, then the response. ``mcp.json_response:
true`` answers every POST as JSON (progress notifications are then dropped). Before either, the body is read
by ``sidecar.mcp.envelope``: one that is not a single JSON-RPC message (not JSON, a batch, an id that is neither
a string nor an integer) is answered 400 with the JSON-RPC error it is owed (id null) and never reaches the SDK.

The MCP SDK's transport chooses per session, not per request; ``SessionManager`` makes it choose per
request. Its sessions' transports (``_Transport``) read the choice from a context variable that
``_handle_post_request`` sets in the request's own task, so it holds for that request only (the session's
message router runs in its own task, which never sees it). Both overrides are of the SDK's private
methods, hence its pinned minor version; ``tests/integration/test_mcp_http.py`` checks the content type of
each kind of answer.
"""

from __future__ import annotations

from contextvars import ContextVar

from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCRequest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sidecar.mcp import envelope

__all__ = ["SessionManager", "asks_for_progress"]

_ANSWER_AS_JSON: ContextVar[bool] = ContextVar("toolbooth_mcp_answer_as_json", default=False)


def asks_for_progress(message: JSONRPCMessage) -> bool:
    """Whether a JSON-RPC message is a request whose ``params._meta`` carries a ``progressToken``."""
    return isinstance(message, JSONRPCRequest) and progress_token_from_params(message.params) is not None


class _Transport(StreamableHTTPServerTransport):
    """The SDK's transport of one session, answering as JSON each request that asks for no progress."""

    @property  # the SDK reads it for each request, in the request's task (and in its message router)
    def is_json_response_enabled(self) -> bool:
        return self._always_json or _ANSWER_AS_JSON.get()

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        self._always_json = value

    async def _handle_post_request(self, scope: Scope, request: Request, receive: Receive, send: Send) -> None:
        # The size was checked before (the SDK's RequestBodyLimitMiddleware); the request keeps the body for
        # the SDK's own reading.
        try:
            message = envelope.read(await request.body())
        except envelope.Refused as refused:
            await _refused(refused.error)(scope, receive, send)
            return
        answer_as_json = _ANSWER_AS_JSON.set(not asks_for_progress(message))
        try:
            await super()._handle_post_request(scope, request, receive, send)
        finally:
            _ANSWER_AS_JSON.reset(answer_as_json)


class SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager whose sessions answer each POST as JSON unless it asks for progress."""

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            # The SDK builds the transport (and registers it) itself; this one only changes its answers.
            always_json = vars(transport).pop("is_json_response_enabled")
            transport.__class__ = _Transport
            transport.is_json_response_enabled = always_json
        return transport


def _refused(error: JSONRPCError) -> Response:
    """400 with the JSON-RPC error, as the SDK answers a body it cannot parse."""
    return Response(error.model_dump_json(by_alias=True, exclude_unset=True), status_code=400,
                    media_type="application/json")
