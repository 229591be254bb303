"""What runs around every call of Toolbooth's own services, outermost first (``chain``).

``StatusInterceptor`` maps exceptions to gRPC statuses (the only place that does);
``AuthInterceptor`` authenticates the caller and hands servicers the ``current_principal()``.
Both build on ``UnaryInterceptor``, as an access log, metrics or tracing would.
"""

from __future__ import annotations

from sidecar.server.auth import Authenticator
from sidecar.server.interceptors.auth import AuthInterceptor, current_principal
from sidecar.server.interceptors.status import StatusInterceptor
from sidecar.server.interceptors.unary import UnaryInterceptor

__all__ = ["AuthInterceptor", "StatusInterceptor", "UnaryInterceptor", "chain", "current_principal"]


def chain(authenticator: Authenticator) -> list[UnaryInterceptor]:
    """The interceptors of the server, outermost first: the status mapping sees what authentication raises."""
    return [StatusInterceptor(), AuthInterceptor(authenticator)]
