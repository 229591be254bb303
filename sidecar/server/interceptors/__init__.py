"""What runs around every call of Toolbooth's own services, outermost first (``chain``).

``StatusInterceptor`` maps exceptions to gRPC statuses (the only place that does);
``AuthInterceptor`` authenticates the caller and hands servicers the ``current_principal()``;
``MetricsInterceptor`` (with ``metrics.listen``) counts and times every call, outside both.
All build on ``UnaryInterceptor``, as an access log or tracing would.
"""

from __future__ import annotations

from sidecar.metrics import Metrics
from sidecar.server.auth import Authenticator
from sidecar.server.interceptors.auth import AuthInterceptor, current_principal
from sidecar.server.interceptors.metrics import MetricsInterceptor
from sidecar.server.interceptors.status import StatusInterceptor
from sidecar.server.interceptors.unary import UnaryInterceptor

__all__ = ["AuthInterceptor", "MetricsInterceptor", "StatusInterceptor", "UnaryInterceptor", "chain",
           "current_principal"]


def chain(authenticator: Authenticator, *, metrics: Metrics | None = None) -> list[UnaryInterceptor]:
    """The interceptors of the server, outermost first: the status mapping sees what authentication raises,
    and the metrics (when on) the status each call ends with."""
    measured: list[UnaryInterceptor] = [] if metrics is None else [MetricsInterceptor(metrics)]
    return [*measured, StatusInterceptor(), AuthInterceptor(authenticator)]
