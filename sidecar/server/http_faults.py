"""The HTTP status of each ``sidecar.faults.FaultKind``: the one table the sidecar's HTTP endpoints answer from.

A request an HTTP endpoint refuses before it is a call (MCP's Streamable HTTP: a refused token; HTTP/JSON:
any failure outside the ``ToolResult``) gets its fault's kind's status and its public message, as a gRPC
caller gets its kind's status (``sidecar.server.interceptors.status``).
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from types import MappingProxyType

from sidecar.faults import FaultKind

__all__ = ["HTTP_STATUSES"]

HTTP_STATUSES: Mapping[FaultKind, HTTPStatus] = MappingProxyType({
    FaultKind.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    FaultKind.INVALID_REQUEST: HTTPStatus.BAD_REQUEST,
    FaultKind.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    FaultKind.INTERNAL: HTTPStatus.INTERNAL_SERVER_ERROR,
})
