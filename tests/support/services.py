"""A real sidecar serving every Toolbooth service (tools, approvals, policy status) as ``serve`` builds it.

``serving(settings, registry)`` opens the reloading engine and the pipeline over ``settings`` (SQLite or
PostgreSQL), binds and starts the server with the ``ApprovalService`` and ``PolicyService`` too, and
yields a ``Services``: a channel with a stub for each service, raw callers (bytes in, bytes out) for
each method, and the store, to see what was written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.bootstrap import open_sidecar
from sidecar.config import Settings
from sidecar.pipeline import Pipeline
from sidecar.server import create_server
from sidecar.state import AuditEvent
from sidecar.state.sql_store import SqlStore
from sidecar.telemetry.tracing import Tracing
from sidecar.tools.registry import Registry

__all__ = ["METHODS", "Services", "serving"]

# Every method of every Toolbooth service, by name: its path on the wire.
METHODS = {method.name: f"/{service.full_name}/{method.name}"
           for service in pb.DESCRIPTOR.services_by_name.values() for method in service.methods}


@dataclass
class Services:
    """A channel to a real sidecar, a stub per service and the pipeline it serves with."""

    pipeline: Pipeline
    channel: grpc.aio.Channel

    def __post_init__(self) -> None:
        self.tools = pb_grpc.ToolServiceStub(self.channel)
        self.approvals = pb_grpc.ApprovalServiceStub(self.channel)
        self.policy = pb_grpc.PolicyServiceStub(self.channel)

    def raw(self, method: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        """The method named ``method`` (a key of ``METHODS``), sending and receiving bytes."""
        return self.channel.unary_unary(METHODS[method], request_serializer=None, response_deserializer=None)

    @property
    def store(self) -> SqlStore:
        assert isinstance(self.pipeline.store, SqlStore)
        return self.pipeline.store

    async def events(self) -> list[AuditEvent]:
        """Every audit event written so far."""
        return await self.store.audit_events()

    async def rows(self, table: str) -> int:
        """How many rows ``table`` of the store holds (``idempotency``, ``previews``, ``audit_log``...)."""
        await self.store.flush_audit()
        [(count,)] = await self.store.driver.fetch(f"SELECT count(*) FROM {table}")
        return int(count)


@asynccontextmanager
async def serving(settings: Settings, registry: Registry, *, tracing: Tracing | None = None) -> AsyncIterator[Services]:
    """A started sidecar with every service over ``settings`` and ``registry``, stopped when the block ends;
    tracing with ``tracing`` (default: as the ``OTEL_*`` variables say)."""
    reloader, pipeline = await open_sidecar(settings, registry=registry, tracing=tracing)
    try:
        _, sidecar = await create_server(settings, pipeline, policy=reloader, approvals=pipeline.approvals,
                                         trace_context=pipeline.tracing.enabled)
        await sidecar.start()
        try:
            async with grpc.aio.insecure_channel(sidecar.addresses[-1]) as channel:
                yield Services(pipeline, channel)
        finally:
            await sidecar.stop(None)
    finally:
        await pipeline.aclose()
