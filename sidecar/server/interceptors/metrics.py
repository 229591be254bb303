"""``MetricsInterceptor``: grpc-prometheus's server families for every RPC of Toolbooth's own services.

``grpc_server_started_total`` when the call starts, ``grpc_server_handled_total`` with the status it
ended with and ``grpc_server_handling_seconds`` when it ends: a unary call when it returns, a stream
(``ExecuteToolStream``) after its last reply. It is the outermost interceptor, so the status it counts is
the one the caller gets: what the ``StatusInterceptor`` inside it aborted with, ``CANCELLED`` for a caller
that went away, else the code the servicer set (``OK`` if none).
"""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

import grpc

from sidecar.metrics import Metrics
from sidecar.server.interceptors.unary import Proceed, Rpc, UnaryInterceptor

__all__ = ["MetricsInterceptor"]

T = TypeVar("T")


class MetricsInterceptor(UnaryInterceptor):
    """Counts and times each call into ``metrics``."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        """Serve ``rpc``, counting its start and its end with the status it ended with."""
        meter = self._metrics.rpc(rpc.method)
        meter.started.inc()
        started, code = time.perf_counter(), grpc.StatusCode.UNKNOWN
        try:
            result = await proceed()
            code = rpc.context.code() or grpc.StatusCode.OK
            return result
        except grpc.aio.AbortError:
            code = rpc.context.code() or grpc.StatusCode.UNKNOWN
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            meter.handled(code, time.perf_counter() - started)
