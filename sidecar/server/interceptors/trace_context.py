"""``TraceContextInterceptor``: the calls of an RPC continue the trace its metadata carries (``traceparent``,
``tracestate``: ``sidecar.telemetry.propagation``). In the server's chain only when the sidecar traces."""

from __future__ import annotations

from typing import TypeVar

from sidecar.server.interceptors.unary import Proceed, Rpc, UnaryInterceptor
from sidecar.telemetry.propagation import continuing, trace_headers

__all__ = ["TraceContextInterceptor"]

T = TypeVar("T")


class TraceContextInterceptor(UnaryInterceptor):
    """Hands the trace headers of each RPC's metadata to the pipeline."""

    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        with continuing(trace_headers(rpc.metadata)):
            return await proceed()
