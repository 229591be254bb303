"""``StatusInterceptor``: the one place an exception becomes a gRPC status.

What the caller is told is ``sidecar.faults.classify``'s; the status is its kind's:

===============  ================  ======================================================
``FaultKind``    status            e.g. (exception: details sent)
===============  ================  ======================================================
UNAUTHENTICATED  UNAUTHENTICATED   ``AuthenticationError``: "token expired"
INVALID_REQUEST  INVALID_ARGUMENT  ``InvalidRequestError``: "tool is required"
UNAVAILABLE      UNAVAILABLE       ``DependencyError``: "service unavailable"
INTERNAL         INTERNAL          a bug: "internal error"; the traceback goes to the log
===============  ================  ======================================================

Denials, invalid arguments and failed tools are results, not exceptions, so they never get here.
It is the outermost interceptor: whatever the inner ones (authentication) raise is mapped too.
Request bytes that do not decode as the method's message (which gRPC would end with UNKNOWN,
"Unexpected DecodeError") end with INVALID_ARGUMENT, ``UNDECODABLE_DETAILS``, before anything runs.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import grpc

from sidecar.errors import InvalidRequestError
from sidecar.faults import FaultKind, classify
from sidecar.server.interceptors.unary import UNDECODABLE_DETAILS, Proceed, Rpc, UnaryInterceptor

__all__ = ["UNDECODABLE_DETAILS", "StatusInterceptor", "status_of"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_GRPC_CODES: dict[FaultKind, grpc.StatusCode] = {
    FaultKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    FaultKind.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    FaultKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    FaultKind.INTERNAL: grpc.StatusCode.INTERNAL,
}


def status_of(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and details the caller gets for ``exc``; only constant messages are ever sent."""
    fault = classify(exc)
    return _GRPC_CODES[fault.kind], fault.message


class StatusInterceptor(UnaryInterceptor):
    """Ends a call that raised with the status ``status_of`` gives; logs what was not expected. A request that
    did not decode is refused here, before the layers inside (authentication) run."""

    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        """Serve ``rpc``; an exception ends it with its status instead of gRPC's UNKNOWN and its text."""
        try:
            if rpc.undecodable:
                raise InvalidRequestError(UNDECODABLE_DETAILS)
            return await proceed()
        except grpc.aio.AbortError:
            raise  # the call already has its status
        except Exception as exc:
            code, details = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("unexpected error while serving %s", rpc.method)
            await rpc.context.abort(code, details)
