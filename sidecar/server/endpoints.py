"""The sidecar's HTTP endpoints beside gRPC: one ``Endpoint`` protocol and one table of kinds (``KINDS``).

A kind is named by its ``Settings`` section, as its row of ``sidecar.config.endpoints`` is (its key, dev-mode
rule, workers and extra): here is how it is built over the sidecar's ``Parts`` (a factory that imports its
module only when called, so an endpoint that is off imports nothing) and when it runs beside gRPC (``Phase``):

- ``AROUND_GRPC`` (metrics): started before the gRPC server is built, stopped after it stopped, so a scrape
  sees the whole shutdown;
- ``WITHIN_GRPC`` (MCP, the approval inbox, HTTP/JSON): started before gRPC starts, stopped before it stops,
  each within ``server.shutdown_grace_seconds``.

Within a phase the endpoints start in the table's order and stop in reverse. ``Endpoints.serving(phase)`` builds,
starts and stops those that are on; a new transport is one module and one row here (and its row and section in
``sidecar.config``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Protocol

from sidecar.config import Settings
from sidecar.config.endpoints import ENDPOINTS
from sidecar.metrics import Metrics
from sidecar.server.gateway import ToolGateway
from sidecar.server.roles import ApprovalGateway

__all__ = ["KINDS", "Endpoint", "EndpointKind", "Endpoints", "Parts", "Phase"]


class Endpoint(Protocol):
    """A running HTTP listener of the sidecar's: bound when built, then ``start`` and ``stop`` (each once)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Parts:
    """What the endpoints are built over: the settings and the pipeline's faces."""

    settings: Settings
    gateway: ToolGateway  # the calls of the transports (MCP, HTTP/JSON)
    approvals: ApprovalGateway  # the approval inbox's
    metrics: Metrics | None  # what the metrics endpoint serves (set whenever metrics.listen is)
    reuse_port: bool = False  # one of several workers: an endpoint every worker serves shares its port


class Phase(Enum):
    """When an endpoint runs, relative to the gRPC server."""

    AROUND_GRPC = "around"
    WITHIN_GRPC = "within"


@dataclass(frozen=True)
class EndpointKind:
    """How one endpoint is built and when it runs."""

    phase: Phase
    open: Callable[[Parts], Endpoint]  # binds its socket (``OSError`` ``cannot listen on …`` if it cannot)


def _metrics(parts: Parts) -> Endpoint:
    from sidecar.server.metrics_http import MetricsEndpoint

    assert parts.metrics is not None, "metrics.listen is set but nothing counts"
    return MetricsEndpoint(parts.metrics.registry, parts.settings.metrics)


def _mcp(parts: Parts) -> Endpoint:
    from sidecar.server.mcp_http import McpEndpoint

    return McpEndpoint.open(parts.settings, parts.gateway)


def _approvals_ui(parts: Parts) -> Endpoint:
    from sidecar.server.approvals_ui.endpoint import ApprovalsInbox

    return ApprovalsInbox.open(parts.settings, parts.approvals)


def _http_json(parts: Parts) -> Endpoint:
    from sidecar.server.http_json import HttpJsonEndpoint

    return HttpJsonEndpoint.open(parts.settings, parts.gateway, reuse_port=parts.reuse_port)


KINDS = MappingProxyType({  # named and ordered as sidecar.config.endpoints.ENDPOINTS
    "mcp": EndpointKind(Phase.WITHIN_GRPC, _mcp),
    "approvals_ui": EndpointKind(Phase.WITHIN_GRPC, _approvals_ui),
    "http_json": EndpointKind(Phase.WITHIN_GRPC, _http_json),
    "metrics": EndpointKind(Phase.AROUND_GRPC, _metrics),
})


@dataclass(frozen=True)
class Endpoints:
    """The endpoints one sidecar serves: those of ``sidecar.config.endpoints`` whose ``listen`` is set."""

    parts: Parts

    @property
    def names(self) -> tuple[str, ...]:
        """The sections of the endpoints that are on, in the order they start."""
        return tuple(row.section for row in ENDPOINTS if row.listen(self.parts.settings) is not None)

    @contextlib.asynccontextmanager
    async def serving(self, phase: Phase) -> AsyncIterator[None]:
        """The endpoints of ``phase`` built and started, in order, while the body runs, then stopped in reverse
        (each within its own bound); one that fails to build or start stops those started before it."""
        async with contextlib.AsyncExitStack() as running:
            for name in self.names:
                kind = KINDS[name]
                if kind.phase is phase:
                    endpoint = kind.open(self.parts)
                    await endpoint.start()
                    running.push_async_callback(endpoint.stop)
            yield
