"""What runs around every call of Toolbooth's own services, outermost first (``chain``).

``AccessLogInterceptor`` writes one line per RPC once it ended (when the access log writes INFO lines);
``StatusInterceptor`` maps exceptions to gRPC statuses (the only place that does);
``TraceContextInterceptor`` hands the caller's trace context to the pipeline (when the sidecar traces);
``AuthInterceptor`` authenticates the caller and hands servicers the ``current_principal()``;
``MetricsInterceptor`` (with ``metrics.listen``) counts and times every call, and ``AccessLogInterceptor``
(``logging.access``) writes its access line, outside all of them.
All are ``UnaryInterceptor`` layers, which ``Layered`` wraps every Toolbooth method's handler in when it registers
the services.
"""

from __future__ import annotations

from sidecar.metrics import Metrics
from sidecar.server.auth import Authenticator
from sidecar.server.interceptors.access import AccessLogInterceptor
from sidecar.server.interceptors.auth import AuthInterceptor, current_principal
from sidecar.server.interceptors.metrics import MetricsInterceptor
from sidecar.server.interceptors.status import StatusInterceptor
from sidecar.server.interceptors.trace_context import TraceContextInterceptor
from sidecar.server.interceptors.unary import Layered, UnaryInterceptor

__all__ = ["AccessLogInterceptor", "AuthInterceptor", "Layered", "MetricsInterceptor", "StatusInterceptor",
           "TraceContextInterceptor", "UnaryInterceptor", "chain", "current_principal"]


def chain(authenticator: Authenticator, *, metrics: Metrics | None = None, trace_context: bool = False,
          access_log: bool = False) -> list[UnaryInterceptor]:
    """The interceptors of the server, outermost first: the metrics (when on) and the access log see the status
    each call ends with, the status mapping sees what authentication raises. Each optional one is left out when
    it would do nothing (the access log: unless ``access_log``, or when INFO lines are not written)."""
    interceptors: list[UnaryInterceptor] = [] if metrics is None else [MetricsInterceptor(metrics)]
    if access_log and AccessLogInterceptor.wanted():
        interceptors.append(AccessLogInterceptor())
    interceptors.append(StatusInterceptor())
    if trace_context:
        interceptors.append(TraceContextInterceptor())
    interceptors.append(AuthInterceptor(authenticator))
    return interceptors
