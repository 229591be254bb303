"""What a request that failed outside a call's result is told, whatever carries it: ``classify(exc)`` -> ``Fault``.

=======================  ===============  ==============================================  =========
exception                ``FaultKind``    public message                                  retryable
=======================  ===============  ==============================================  =========
``AuthenticationError``  UNAUTHENTICATED  its constant message (e.g. "token expired")     no
``InvalidRequestError``  INVALID_REQUEST  its constant message (e.g. "tool is required")  no
``DependencyError``      UNAVAILABLE      "service unavailable"                           yes [1]_
anything else (a bug)    INTERNAL         "internal error"                                no
=======================  ===============  ==============================================  =========

.. [1] not for a ``MalformedDecisionError`` (a policy bug) or a ``StoreRefusedError`` (the data itself is
   refused): asking again fails again, as ``refusal`` says for a call's result.

Only this module reads the exception; each transport maps the kind to its own code in one table
(``sidecar.server.interceptors.status``: gRPC statuses, ``sidecar.mcp.server``: JSON-RPC errors,
``sidecar.server.http_faults``: HTTP statuses), so a new kind without a code there fails a test. The
details of an unavailable dependency or of a bug never reach the caller; the transport logs a bug with its
traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.errors import (
    AuthenticationError,
    DependencyError,
    InvalidRequestError,
    MalformedDecisionError,
    StoreRefusedError,
)

__all__ = ["Fault", "FaultKind", "classify"]

_UNAVAILABLE = "service unavailable"
_INTERNAL = "internal error"
_NOT_WORTH_RETRYING = (MalformedDecisionError, StoreRefusedError)


class FaultKind(StrEnum):
    """Why a request failed outside a call's result; each transport has one code for each."""

    UNAUTHENTICATED = "UNAUTHENTICATED"
    INVALID_REQUEST = "INVALID_REQUEST"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"


@dataclass(frozen=True, slots=True)
class Fault:
    """A failure as a caller may see it: its kind, a message safe to send, and whether asking again may help."""

    kind: FaultKind
    message: str
    retryable: bool


def classify(exc: BaseException) -> Fault:
    """The ``Fault`` a caller gets for ``exc``; only constant messages are ever in it."""
    if isinstance(exc, AuthenticationError):
        return Fault(FaultKind.UNAUTHENTICATED, str(exc), retryable=False)
    if isinstance(exc, InvalidRequestError):
        return Fault(FaultKind.INVALID_REQUEST, str(exc), retryable=False)
    if isinstance(exc, DependencyError):
        return Fault(FaultKind.UNAVAILABLE, _UNAVAILABLE, retryable=not isinstance(exc, _NOT_WORTH_RETRYING))
    return Fault(FaultKind.INTERNAL, _INTERNAL, retryable=False)
