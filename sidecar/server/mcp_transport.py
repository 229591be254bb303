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
One that passes is parsed and validated once more by the SDK, whose POST handler takes only the body.
A request whose id is in flight in its session is answered 409 with -32600 (``sidecar.mcp.request_ids``).
An ``initialize`` request of more than ``mcp.max_initialize_bytes`` is answered 413 with -32600 and its id, and
opens no session: a session keeps its ``initialize`` params (client information, capabilities) for its life.
What the server is handed with each message is the request's state only (principal and trace headers), not
the request: the session keeps the last message it read while it idles, and with it the request's scope,
headers, body reader and connection (``sidecar.server.mcp_sessions`` says how many sessions there may be).
It also keeps the last answer its message router routed, until it routes another: that router drops nothing
it is handed (an answer goes by its id to a request's stream, anything else to the event stream), so there is
no marker to push through it as there is for the dispatcher after a large body (``limits.max_result_bytes``
bounds a call's).

The MCP SDK's transport chooses per session, not per request; ``SessionManager`` makes it choose per
request. Its sessions' transports (``_Transport``) read the choice from a context variable that
``_handle_post_request`` sets in the request's own task, so it holds for that request only (the session's
message router runs in its own task, which never sees it). Both overrides are of the SDK's private
methods, hence its pinned minor version; ``tests/integration/test_mcp_http.py`` checks the content type of
each kind of answer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeGuard, TypeVar, cast

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared._context_streams import ContextSendStream
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import CloseSSEStreamCallback, ServerMessageMetadata, SessionMessage
from mcp_types import INVALID_REQUEST, JSONRPCError, JSONRPCMessage, JSONRPCRequest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sidecar.mcp import envelope
from sidecar.mcp.request_ids import DUPLICATE, InFlightIds

__all__ = ["SessionManager", "asks_for_progress", "error_response"]

log = logging.getLogger(__name__)

_ANSWER_AS_JSON: ContextVar[bool] = ContextVar("toolbooth_mcp_answer_as_json", default=False)
_INITIALIZE_TOO_LARGE = ("Invalid Request: this initialize request is larger than the endpoint accepts "
                         "(mcp.max_initialize_bytes); send a smaller one")
_READ_ON = Exception("toolbooth: nothing to read (the dispatcher drops an exception it is handed)")
_LARGE_BODY = 64 * 1024  # a POST's body larger than this is worth the marker after it (_forget_last_message)

T = TypeVar("T")


def asks_for_progress(message: JSONRPCMessage) -> bool:
    """Whether a JSON-RPC message is a request whose ``params._meta`` carries a ``progressToken``."""
    return isinstance(message, JSONRPCRequest) and progress_token_from_params(message.params) is not None


class _Transport(StreamableHTTPServerTransport):
    """The SDK's transport of one session, answering as JSON each request that asks for no progress and
    refusing a request whose id is in flight or an ``initialize`` larger than ``_max_initialize_bytes``."""

    _ids: InFlightIds
    _max_initialize_bytes: int

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
            body = await request.body()
        except ClientDisconnect:  # gone before its body arrived (or cut off by the request deadline): no answer
            log.debug("MCP: a client left before its request arrived")
            return
        try:
            message = envelope.read(body)
        except envelope.Refused as refused:
            await error_response(refused.error)(scope, receive, send)
            return
        if _is_initialize(message) and len(body) > self._max_initialize_bytes:
            too_large = envelope.error(INVALID_REQUEST, _INITIALIZE_TOO_LARGE, request_id=message.id)
            await error_response(too_large, status_code=413)(scope, receive, send)
            return
        if isinstance(message, JSONRPCRequest) and not self._ids.claim(message.id):
            duplicate = envelope.error(INVALID_REQUEST, DUPLICATE)
            await error_response(duplicate, status_code=409)(scope, receive, send)
            return
        answer_as_json = _ANSWER_AS_JSON.set(not asks_for_progress(message))
        try:
            await super()._handle_post_request(scope, request, receive, send)
        finally:
            _ANSWER_AS_JSON.reset(answer_as_json)
            if isinstance(message, JSONRPCRequest):
                self._ids.release(message.id)
        if len(body) > _LARGE_BODY:
            await self._forget_last_message()

    async def _forget_last_message(self) -> None:
        """Make the session's dispatcher let go of the message it read last, which it keeps (params and all,
        up to ``limits.max_message_bytes``) until it reads another: it reads this marker instead, which it drops
        (a handler still running keeps what it needs)."""
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            if self._read_stream_writer is not None and not self.is_terminated:
                await self._read_stream_writer.send(_READ_ON)

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[ReadStream[SessionMessage | Exception],
                                                   WriteStream[SessionMessage]]]:
        async with super().connect() as (read, write):
            # What goes to the session and what it answers, so an id stays in flight until it is answered.
            assert self._read_stream_writer is not None
            self._read_stream_writer = _Watched(self._read_stream_writer, self._ids.handed_over)
            self._write_stream = _Watched(cast(ContextSendStream[SessionMessage], write), self._ids.answered)
            yield read, cast(WriteStream[SessionMessage], self._write_stream)

    def _message_metadata(self, request: Request, *, close_sse_stream: CloseSSEStreamCallback | None = None,
                          close_standalone_sse_stream: CloseSSEStreamCallback | None = None,
                          on_request_unanswered: Callable[[], Awaitable[None]] | None = None,
                          ) -> ServerMessageMetadata:
        state_only = Request({"type": "http", "state": request.scope.get("state", {})})  # what principal_of reads
        return super()._message_metadata(state_only, close_sse_stream=close_sse_stream,
                                         close_standalone_sse_stream=close_standalone_sse_stream,
                                         on_request_unanswered=on_request_unanswered)


class SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager whose sessions answer each POST as JSON unless it asks for progress, and take
    no ``initialize`` of more than ``max_initialize_bytes``."""

    def __init__(self, server: Server[Any], *, max_initialize_bytes: int, **options: Any) -> None:
        super().__init__(server, **options)
        self._max_initialize_bytes = max_initialize_bytes

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            # The SDK builds the transport (and registers it) itself; this one only changes its answers.
            always_json = vars(transport).pop("is_json_response_enabled")
            transport.__class__ = _Transport
            assert isinstance(transport, _Transport)
            transport.is_json_response_enabled = always_json
            transport._ids = InFlightIds()
            transport._max_initialize_bytes = self._max_initialize_bytes
        return transport


class _Watched(ContextSendStream[T]):
    """A session's stream that shows each message to ``seen`` before sending it."""

    __slots__ = ("_seen",)

    def __init__(self, stream: ContextSendStream[T], seen: Callable[[T], None]) -> None:
        super().__init__(stream._inner)
        self._seen = seen

    async def send(self, item: T) -> None:
        self._seen(item)
        await super().send(item)


def _is_initialize(message: JSONRPCMessage) -> TypeGuard[JSONRPCRequest]:
    return isinstance(message, JSONRPCRequest) and message.method == "initialize"


def error_response(error: JSONRPCError, *, status_code: int = 400) -> Response:
    """The JSON-RPC error as the body (400 by default, as the SDK answers a body it cannot parse)."""
    return Response(error.model_dump_json(by_alias=True, exclude_unset=True), status_code=status_code,
                    media_type="application/json")
