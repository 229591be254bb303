"""What runs around every call of Toolbooth's own services, outermost first (``chain``).

``AccessLogInterceptor`` writes one line per RPC once it ended (when the access log writes INFO lines);
``StatusInterceptor`` maps exceptions to gRPC statuses (the only place that does);
``TraceContextInterceptor`` hands the caller's trace context to the pipeline (when the sidecar traces);
``AuthInterceptor`` authenticates the caller and hands servicers the ``current_principal()``.
All build on ``UnaryInterceptor``, as metrics would.
"""

from __future__ import annotations

from sidecar.server.auth import Authenticator
from sidecar.server.interceptors.access import AccessLogInterceptor
from sidecar.server.interceptors.auth import AuthInterceptor, current_principal
from sidecar.server.interceptors.status import StatusInterceptor
from sidecar.server.interceptors.trace_context import TraceContextInterceptor
from sidecar.server.interceptors.unary import UnaryInterceptor

__all__ = ["AccessLogInterceptor", "AuthInterceptor", "StatusInterceptor", "TraceContextInterceptor",
           "UnaryInterceptor", "chain", "current_principal"]


def chain(authenticator: Authenticator, *, trace_context: bool = False,
          access_log: bool = True) -> list[UnaryInterceptor]:
    """The interceptors of the server, outermost first: the access log sees the status the mapping chose, the
    status mapping sees what authentication raises. Each optional one is left out when it would do nothing
    (or, the access log, when ``access_log`` is false)."""
    wanted = access_log and AccessLogInterceptor.wanted()
    interceptors: list[UnaryInterceptor] = [AccessLogInterceptor()] if wanted else []
    interceptors.append(StatusInterceptor())
    if trace_context:
        interceptors.append(TraceContextInterceptor())
    interceptors.append(AuthInterceptor(authenticator))
    return interceptors
