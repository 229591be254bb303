"""The HTTP/JSON endpoint (``http_json.listen``): ``POST /v1/call`` runs one call and answers its ``ToolResult``.

The body is one JSON object with the fields of ``ExecuteTool`` (``sidecar.contract.CallRequest``), the arguments
as a JSON value rather than text::

    {"tool": "send_email", "arguments": {"to": "a@example.com"}, "idempotency_key": "k-1",
     "approval_id": null, "conversation_id": "c-9", "call_id": "call-7"}

Only ``tool`` is required. The call goes to the pipeline (``ToolGateway.execute``) as a gRPC call does, so every
field is checked there, by the same rules (``sidecar.pipeline.fields``), and a refused call is audited.

Two channels, as over gRPC: a call that ran, was denied, held for approval or refused for its arguments or fields
is ``200`` with the ``ToolResult`` as JSON (what ``toolbooth call --output json`` prints; ``status`` and ``error.code``
say what happened; a ``RATE_LIMITED`` one that says when to try again also carries a ``Retry-After`` header). A
request the endpoint cannot take is a typed error,
``{"error": {"code", "message", "retryable"[, "field"]}}`` (``retryable``: whether sending it again may help):

======  ==========================  ===========================================================
status  code                        when
======  ==========================  ===========================================================
401     ``UNAUTHENTICATED``         no bearer token, or one the authenticator refuses
415     ``UNSUPPORTED_MEDIA_TYPE``  a ``Content-Type`` other than ``application/json``
413     ``PAYLOAD_TOO_LARGE``       a body above ``limits.max_message_bytes``
400     ``MALFORMED_JSON``          a body that is not one JSON text in UTF-8
400     ``UNKNOWN_FIELD``           a key the call has no field for (``field`` names it)
400     ``INVALID_REQUEST``         not an object, no ``tool``, a field of the wrong type; a request that
                                    is not HTTP/1.1 (two ``Content-Length``, a head past its bound)
421     ``MISDIRECTED_REQUEST``     on a loopback address: a ``Host`` that names no loopback host
403     ``FORBIDDEN_ORIGIN``        on a loopback address: an ``Origin`` that is not a loopback origin
404     ``NOT_FOUND``               any other path (``/v1/call/`` too: never redirected); 405
                                    ``METHOD_NOT_ALLOWED``: any other method
503     ``UNAVAILABLE``             the store or policy engine cannot answer, or the sidecar stopped (retry)
500     ``INTERNAL``                a bug; the traceback goes to the log
======  ==========================  ===========================================================

The caller authenticates as over gRPC (``sidecar.server.auth``: the bearer JWT of ``Authorization``; dev mode:
the static principal, on loopback only), before its body is read; on a loopback address ``Host`` and ``Origin``
are checked first (``sidecar.server.http_hosts``: a rebound web page cannot call). Its trace headers
(``traceparent``) are the trace the call continues. The arguments reach the pipeline as JSON text, a number
Python does not read as written (an integer past ``sys.get_int_max_str_digits``, ``1e400``) as it came, so the
pipeline refuses it as over gRPC.
uvicorn serves it on the sidecar's loop within the listener bounds of ``sidecar.server.http_limits``
(``http_json.http``); ``stop`` takes no new connection and lets the calls in flight finish within
``server.shutdown_grace_seconds`` (``sidecar.server.http_drain``); one still running then is ended and answered
``503 UNAVAILABLE``. A client that leaves before its body arrived gets no answer and a debug line. With
``logging.access`` each request to ``/v1/call`` gets an access line (``POST /v1/call 401 0.31 ms``), as an RPC does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import time
from typing import Any, NoReturn

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sidecar.config import CALL_PATH, Settings
from sidecar.contract import CallRequest, Principal, ToolResult
from sidecar.faults import FaultKind, classify
from sidecar.pipeline.fields import FieldRule
from sidecar.pipeline.stages.request import placeholder
from sidecar.server.auth import Authenticator
from sidecar.server.gateway import TOOL_REQUIRED, ToolGateway
from sidecar.server.http_drain import InFlight
from sidecar.server.http_faults import HTTP_STATUSES
from sidecar.server.http_hosts import FOREIGN_ORIGIN, MISDIRECTED, foreign_origin, misdirected
from sidecar.server.http_limits import bounded_server, listener_limits, start_on
from sidecar.server.interceptors.access import ACCESS_LOGGER, AccessLogInterceptor
from sidecar.server.listeners import tcp_socket
from sidecar.telemetry.propagation import continuing, trace_headers

__all__ = ["HttpJsonEndpoint", "Refused"]

log = logging.getLogger(__name__)
_access_log = logging.getLogger(ACCESS_LOGGER)

_STRING_FIELDS = ("tool", "idempotency_key", "approval_id", "conversation_id", "call_id")
_FIELDS = frozenset({*_STRING_FIELDS, "arguments"})
_MEDIA_TYPE = "application/json"
_KEY = FieldRule(256)  # an unknown key is named as it is within this rule, else as the pipeline records a bad value
_SETTLE_SECONDS = 0.5  # past the grace, what a call's result stopped at it gets to be answered before a 503
_CLOSE_SECONDS = 1  # once the calls ended, what is left of the connections gets this long to close


class Refused(Exception):
    """A request the endpoint does not take: its status, stable code, constant message, the field at fault and
    whether sending it again may help."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, *,
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.retryable = status, code, message, field, retryable

    def response(self) -> JSONResponse:
        error = {"code": self.code, "message": self.message, "retryable": self.retryable,
                 **({"field": self.field} if self.field else {})}
        headers = {"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{self.message}"'} \
            if self.status == 401 else None
        return JSONResponse({"error": error}, status_code=self.status, headers=headers)


class HttpJsonEndpoint:
    """The HTTP/JSON endpoint of one sidecar: bound by ``open``, then ``start`` and ``stop`` (each once)."""

    def __init__(self, app: Starlette, calls: _Calls, bound: socket.socket, *, host: str,
                 settings: Settings) -> None:
        self._socket, self._calls, self._in_flight = bound, calls, InFlight(app)
        self._grace = settings.server.shutdown_grace_seconds
        self.url = f"http://{host}:{bound.getsockname()[1]}{CALL_PATH}"
        self._server = bounded_server(self._in_flight, listener_limits(settings, "http_json"),
                                      close_seconds=_CLOSE_SECONDS, json_errors=True)

    @classmethod
    def open(cls, settings: Settings, gateway: ToolGateway, *, reuse_port: bool = False) -> HttpJsonEndpoint:
        """The endpoint of ``settings.http_json`` over ``gateway``, its socket bound (shared with other workers'
        with ``reuse_port``); ``OSError`` ``cannot listen on …`` if it cannot be."""
        endpoint = settings.http_json.endpoint
        assert endpoint is not None, "http_json.listen is not set"
        calls = _Calls(gateway, Authenticator(settings.auth), settings.limits.max_message_bytes,
                       loopback=endpoint.is_loopback,
                       access=settings.logging.access and AccessLogInterceptor.wanted())
        app = Starlette(routes=[Route(CALL_PATH, calls.call, methods=["POST"])],
                        exception_handlers={HTTPException: _http_error})  # type: ignore[dict-item]
        app.router.redirect_slashes = False  # /v1/call/ is not found, never redirected to where Host says
        host = endpoint.host.removeprefix("[").removesuffix("]")
        bound = tcp_socket(f"http_json.listen {settings.http_json.listen}", host, endpoint.port, reuse_port=reuse_port)
        return cls(app, calls, bound, host=endpoint.host, settings=settings)

    async def start(self) -> None:
        """Serve on this loop; returns once it accepts connections."""
        await start_on(self._server, self._socket, f"http_json.listen {self.url}")
        log.info("HTTP/JSON calls on %s", self.url)

    async def stop(self) -> None:
        """Take no new connection; let the calls in flight finish within the grace, answer those still running
        ``503``, then close the connections."""
        drained = await self._in_flight.drain(self._server, self._grace, "HTTP/JSON endpoint")
        # a served sidecar's pipeline ends its handlers at the grace too (``stop_by``): their results go first
        if not drained and not await self._in_flight.settled(_SETTLE_SECONDS):
            self._calls.cut()
            await self._in_flight.settled(_CLOSE_SECONDS)
        await self._server.shutdown()
        self._socket.close()


class _Calls:
    """``POST /v1/call``: authenticate, read and check the body, run the call, answer its result."""

    def __init__(self, gateway: ToolGateway, authenticator: Authenticator, max_bytes: int, *,
                 loopback: bool, access: bool) -> None:
        self._gateway, self._authenticator, self._max_bytes = gateway, authenticator, max_bytes
        self._loopback, self._access = loopback, access
        self._running: set[asyncio.Timeout] = set()  # the scopes of the calls running, for ``cut``
        self._stopped = False

    async def call(self, request: Request) -> Response:
        started = time.perf_counter()
        response = await self._answer(request)
        if self._access:
            duration_ms = round((time.perf_counter() - started) * 1000, 2)
            _access_log.info("POST %s %d %s ms", CALL_PATH, response.status_code, duration_ms,
                             extra={"method": f"POST {CALL_PATH}", "http_status": response.status_code,
                                    "duration_ms": duration_ms})
        return response

    async def _answer(self, request: Request) -> Response:
        metadata = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.scope["headers"]]
        scope = asyncio.timeout(None)
        try:
            self._check_host(request)
            principal = await self._authenticator.authenticate(metadata)
            call = _call_request(await self._body(request))
            with continuing(trace_headers(metadata)):
                result = await self._execute(principal, call, scope)
        except Refused as refused:
            return refused.response()
        except ClientDisconnect:  # gone before its body arrived (or cut off by the request deadline)
            log.debug("HTTP/JSON: a client left before its request arrived")
            return Refused(400, "INVALID_REQUEST", "the request did not arrive").response()  # read by no one
        except Exception as exc:  # noqa: BLE001 - every failure is answered; a bug is logged with its traceback
            return (_stopped() if scope.expired() else _refused(exc, request)).response()
        retry = None if result.error is None else result.error.retry_after_seconds
        headers = None if retry is None else {"Retry-After": str(retry)}
        return JSONResponse(result.model_dump(mode="json"), headers=headers)

    def cut(self) -> None:
        """End the calls still running (each is answered ``503``), and any call that would start."""
        self._stopped = True
        now = asyncio.get_running_loop().time()
        for scope in self._running:
            scope.reschedule(now)

    async def _execute(self, principal: Principal, call: CallRequest, scope: asyncio.Timeout) -> ToolResult:
        """Run ``call`` within ``scope``, which ``cut`` ends (``TimeoutError``)."""
        if self._stopped:
            raise _stopped()
        async with scope:
            self._running.add(scope)
            try:
                return await self._gateway.execute(principal, call)
            finally:
                self._running.discard(scope)

    def _check_host(self, request: Request) -> None:
        """On loopback, ``Refused`` for a ``Host`` or ``Origin`` that names another host (DNS rebinding)."""
        if not self._loopback:
            return
        if misdirected(request.headers.get("host")):
            raise Refused(421, "MISDIRECTED_REQUEST", MISDIRECTED)
        if foreign_origin(request.headers.get("origin")):
            raise Refused(403, "FORBIDDEN_ORIGIN", FOREIGN_ORIGIN)

    async def _body(self, request: Request) -> Any:
        """The body as JSON, if it is JSON and within its bound; else ``Refused``."""
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != _MEDIA_TYPE:
            raise Refused(415, "UNSUPPORTED_MEDIA_TYPE", f"the body must be {_MEDIA_TYPE}")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_bytes:
            _too_large(self._max_bytes)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self._max_bytes:
                _too_large(self._max_bytes)
        try:
            return json.loads(body.decode("utf-8"), parse_constant=_no_constant, parse_int=_integer,
                              parse_float=_real)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise _malformed() from None


def _call_request(body: Any) -> CallRequest:
    """The call ``body`` asks for; ``Refused`` for what the call has no field for, or a field of the wrong type.
    The values themselves are the pipeline's to check."""
    if not isinstance(body, dict):
        raise Refused(400, "INVALID_REQUEST", "the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        key = unknown[0] if _KEY.problem(unknown[0]) is None else placeholder(unknown[0])
        raise Refused(400, "UNKNOWN_FIELD", f"unknown field {key!r}: a call has {', '.join(sorted(_FIELDS))}",
                      field=key)
    for name in _STRING_FIELDS:
        if not isinstance(body.get(name), str | None):
            raise Refused(400, "INVALID_REQUEST", f"{name} must be a string", field=name)
    if not body.get("tool"):
        raise Refused(400, "INVALID_REQUEST", TOOL_REQUIRED, field="tool")
    optional = {name: body.get(name) or None for name in _STRING_FIELDS if name != "tool"}
    return CallRequest(tool=body["tool"], arguments_json=_arguments_json(body.get("arguments")), **optional)


class _Written:
    """A number Python does not read as it is written, kept as its text: an integer longer than it reads
    (``sys.get_int_max_str_digits``), a number that overflows to infinity (``1e400``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _integer(text: str) -> int | _Written:
    try:
        return int(text)
    except ValueError:
        return _Written(text)


def _real(text: str) -> float | _Written:
    value = float(text)
    return value if math.isfinite(value) else _Written(text)


def _arguments_json(arguments: Any) -> str:
    """``arguments`` as the JSON text the pipeline reads (``""``: none), long integers as they came."""
    if arguments is None:
        return ""
    try:
        return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    except TypeError:  # a ``_Written`` within: written by hand
        try:
            return _written(arguments)
        except RecursionError:
            raise _malformed() from None


def _written(value: Any) -> str:
    """``value`` (what ``json.loads`` read, with ``_Written``) as compact JSON text."""
    if isinstance(value, _Written):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{_written(key)}:{_written(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_written(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _refused(exc: Exception, request: Request) -> Refused:
    """What the caller is told of an exception the authenticator or the gateway raised: its ``sidecar.faults``
    kind (the code), its HTTP status, public message and whether it is worth retrying."""
    fault = classify(exc)
    if fault.kind is FaultKind.INTERNAL:
        log.error("unexpected error while serving %s %s", request.method, request.url.path, exc_info=exc)
    return Refused(HTTP_STATUSES[fault.kind], fault.kind.value, fault.message, retryable=fault.retryable)


def _malformed() -> Refused:
    return Refused(400, "MALFORMED_JSON", "the body is not one JSON text in UTF-8")


def _stopped() -> Refused:
    return Refused(503, "UNAVAILABLE", "the sidecar stopped before the call ended; send it again", retryable=True)


def _too_large(bound: int) -> NoReturn:
    raise Refused(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {bound} bytes (limits.max_message_bytes)")


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (an unknown path, another method) as typed errors too."""
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "INVALID_REQUEST")
    refused = Refused(exc.status_code, code, str(exc.detail)).response()
    refused.headers.update(exc.headers or {})
    return refused
