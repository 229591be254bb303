"""``AccessLogInterceptor``: one line per RPC of Toolbooth's services, once it ended, on logger ``toolbooth.access``.

The line says the method, the gRPC status code the caller got and how long the RPC took, as the message
(``/toolbooth.v1.ToolService/ExecuteTool OK 1.52 ms``) and, for JSON lines, as the fields ``method``,
``grpc_code`` and ``duration_ms``. It is the outermost interceptor, so the code is the one the status
mapping chose, authentication failures included; a server stream's line comes after its last reply. It
is in the server's chain only when that logger writes INFO lines (``log_level`` INFO or DEBUG) and
``logging.access`` is true.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

import grpc

from sidecar.server.interceptors.unary import Proceed, Rpc, UnaryInterceptor

__all__ = ["ACCESS_LOGGER", "AccessLogInterceptor"]

T = TypeVar("T")

ACCESS_LOGGER = "toolbooth.access"

log = logging.getLogger(ACCESS_LOGGER)


class AccessLogInterceptor(UnaryInterceptor):
    """Logs each RPC's method, status code and duration when it ends."""

    @staticmethod
    def wanted() -> bool:
        """Whether the access log writes anything at the configured level."""
        return log.isEnabledFor(logging.INFO)

    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await proceed()
        except grpc.aio.AbortError:
            code = _aborted_code(rpc)
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            code = grpc.StatusCode.UNKNOWN
            raise
        finally:
            duration_ms = round((time.perf_counter() - started) * 1000, 2)
            log.info("%s %s %s ms", rpc.method, code.name, duration_ms,
                     extra={"method": rpc.method, "grpc_code": code.name, "duration_ms": duration_ms})


def _aborted_code(rpc: Rpc) -> grpc.StatusCode:
    """The status the call was aborted with."""
    code = rpc.context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
