"""``StatusInterceptor``: the one place an exception becomes a gRPC status.

=========================  ==================  ==========================================
exception                  status              details sent
=========================  ==================  ==========================================
``AuthenticationError``    UNAUTHENTICATED     its constant message (e.g. "token expired")
``InvalidRequestError``    INVALID_ARGUMENT    its constant message (e.g. "tool is required")
``DependencyError``        UNAVAILABLE         "service unavailable"
anything else (a bug)      INTERNAL            "internal error"; the traceback goes to the log
=========================  ==================  ==========================================

Denials, invalid arguments and failed tools are results, not exceptions, so they never get here.
It is the outermost interceptor: whatever the inner ones (authentication) raise is mapped too.
Request bytes that do not decode as the method's message (which gRPC would end with UNKNOWN,
"Unexpected DecodeError") end with INVALID_ARGUMENT, ``UNDECODABLE_DETAILS``, before anything runs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError

from sidecar.errors import AuthenticationError, DependencyError, InvalidRequestError
from sidecar.server.interceptors.unary import Proceed, Rpc, UnaryInterceptor, behavior_of, is_toolbooth_method

__all__ = ["INTERNAL_DETAILS", "UNAVAILABLE_DETAILS", "UNDECODABLE_DETAILS", "StatusInterceptor", "status_of"]

T = TypeVar("T")
Request = TypeVar("Request")
Response = TypeVar("Response")
_Context = grpc.aio.ServicerContext[Any, Any]
_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Request, Response] | None"]]

log = logging.getLogger(__name__)

UNAVAILABLE_DETAILS = "service unavailable"
INTERNAL_DETAILS = "internal error"
UNDECODABLE_DETAILS = "the request is not a valid protobuf message of this method"


class _Undecodable:
    """What the request deserializer gives for bytes that are not the method's message."""


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and details the caller gets for ``exc``; only constant messages are ever sent."""
    if isinstance(exc, AuthenticationError):
        return grpc.StatusCode.UNAUTHENTICATED, str(exc)
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, DependencyError):
        return grpc.StatusCode.UNAVAILABLE, UNAVAILABLE_DETAILS
    return grpc.StatusCode.INTERNAL, INTERNAL_DETAILS


class StatusInterceptor(UnaryInterceptor):
    """Ends a call that raised with the status ``status_of`` gives; logs what was not expected."""

    async def intercept_service(
        self, continuation: _Continuation[Request, Response], handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Request, Response] | None:
        """The handler wrapped in ``around``; undecodable request bytes become ``InvalidRequestError``."""
        return await super().intercept_service(_decoding_checked(continuation), handler_call_details)

    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        """Serve ``rpc``; an exception ends it with its status instead of gRPC's UNKNOWN and its text."""
        try:
            return await proceed()
        except grpc.aio.AbortError:
            raise  # the call already has its status
        except Exception as exc:
            code, details = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("unexpected error while serving %s", rpc.method)
            await rpc.context.abort(code, details)


def _decoding_checked(continuation: _Continuation[Request, Response]) -> _Continuation[Request, Response]:
    """``continuation`` whose Toolbooth handlers decode leniently and refuse undecodable requests themselves
    (inside ``around``, so that the refusal is mapped like any other)."""

    async def checked(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Request, Response] | None:
        handler = await continuation(details)
        if handler is None or not is_toolbooth_method(details.method):
            return handler
        behavior, rewrap = behavior_of(details.method, handler)
        decode = handler.request_deserializer

        def lenient(data: bytes) -> Request | _Undecodable:
            try:
                return data if decode is None else decode(data)  # type: ignore[return-value]
            except DecodeError:
                return _Undecodable()

        async def refusing(request: Request | _Undecodable, context: _Context) -> Any:
            if isinstance(request, _Undecodable):
                raise InvalidRequestError(UNDECODABLE_DETAILS)
            return await behavior(request, context)

        return cast("grpc.RpcMethodHandler[Request, Response]",
                    rewrap(refusing, lenient, handler.response_serializer))

    return checked
