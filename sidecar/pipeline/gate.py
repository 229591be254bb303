"""``Pipeline``: the one entry every transport calls (list tools, execute calls, look up an operation).

It holds no stage logic: ``execute`` makes a ``Call`` and runs it through the chain that
``sidecar.bootstrap`` built; ``execute_batch`` makes one ``Call`` per call of a batch and runs each
through that same chain (``sidecar.pipeline.batch``); ``execute_streamed`` is ``execute`` with a progress
sink whose reports it sends on (``sidecar.pipeline.progress``). Each ``Call`` carries the trace context the
transport is serving the request in (``sidecar.telemetry.propagation``). ``list_tools`` asks the resolve stage,
which owns availability at discovery as at execution. Denials and failures of a call are ``ToolResult``s;
the only exceptions that leave ``list_tools`` and ``get_operation`` are ``InvalidRequestError`` for a
malformed string field (``sidecar.pipeline.fields``: checked before any policy or store is asked) and
``DependencyError``s (fail closed); ``execute_batch`` raises ``InvalidRequestError`` for an empty or too
large batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sidecar.config import Limits
from sidecar.contract import CallBatch, CallRequest, Operation, Principal, ToolListing, ToolResult
from sidecar.errors import StoreUnavailableError
from sidecar.metrics import Metrics
from sidecar.pipeline import batch as batches
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Chain
from sidecar.pipeline.fields import check_fields
from sidecar.pipeline.operations import find_operation
from sidecar.pipeline.progress import Send, stream_call
from sidecar.pipeline.stages.audit import Auditor
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.resolve import ResolveStage
from sidecar.policy import PolicyEngine
from sidecar.state import Store
from sidecar.telemetry.propagation import incoming
from sidecar.telemetry.tracing import Tracing
from sidecar.tools.definition import ProgressSink
from sidecar.tools.dispatch import Dispatcher
from sidecar.tools.registry import Registry

__all__ = ["Pipeline"]

log = logging.getLogger("toolbooth.pipeline")


@dataclass(slots=True)
class Pipeline:
    """Gates, runs and audits tool calls. Built by ``sidecar.bootstrap``; closes what it was given."""

    registry: Registry
    policy: PolicyEngine
    store: Store
    limits: Limits
    approvals: Approvals
    chain: Chain
    resolve: ResolveStage
    idempotency: IdempotencyStage
    dispatcher: Dispatcher
    auditor: Auditor
    tracing: Tracing
    metrics: Metrics | None = None  # what the sidecar counts (``metrics.listen``); ``None``: nothing

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing:
        """The tools the availability policy shows ``principal``, decided in one pass."""
        check_fields(conversation_id=conversation_id)
        return await self.resolve.listing(principal, conversation_id=conversation_id)

    async def execute(self, principal: Principal, request: CallRequest, *, caller_deadline: float | None = None,
                      progress: ProgressSink | None = None) -> ToolResult:
        """Run ``request`` through every stage and return its typed result; the handler's progress reports go
        to ``progress`` (none: nowhere)."""
        return await self.chain(self._call(principal, request, caller_deadline, progress))

    async def execute_batch(self, principal: Principal, batch: CallBatch, *,
                            caller_deadline: float | None = None) -> tuple[ToolResult, ...]:
        """Run every call of ``batch`` through every stage, each on its own; their results in request order."""
        requests = batches.checked_calls(batch, self.limits)
        calls = [self._call(principal, request, caller_deadline) for request in requests]
        return await batches.run_batch(calls, self.chain, self.auditor,
                                       concurrency=batches.concurrency(batch, self.limits),
                                       cancel_on_permanent_failure=batch.cancel_on_permanent_failure)

    async def execute_streamed(self, principal: Principal, request: CallRequest, send: Send, *,
                               caller_deadline: float | None = None) -> ToolResult:
        """``execute``, sending the handler's progress reports to ``send`` (rate-limited, the last one always)
        before returning the result."""
        return await stream_call(
            lambda sink: self.execute(principal, request, caller_deadline=caller_deadline, progress=sink), send,
            per_second=self.limits.progress_events_per_second)

    def _call(self, principal: Principal, request: CallRequest, caller_deadline: float | None,
              progress: ProgressSink | None = None) -> Call:
        return Call(principal, request, self.policy.revision, caller_deadline, progress, trace_headers=incoming())

    async def get_operation(self, principal: Principal, *, tool: str | None = None, key: str | None = None,
                            request_id: str | None = None) -> Operation:
        """Where ``principal``'s keyed call stands, by ``request_id`` or by ``tool`` and ``key``."""
        check_fields(tool=tool, idempotency_key=key, request_id=request_id)
        try:
            return await find_operation(self.store, principal, tool=tool, key=key, request_id=request_id)
        except StoreUnavailableError as exc:
            log.error("store unavailable during GetOperation: %s", exc)
            raise

    def stop_by(self, at: float) -> None:
        """Shutdown's bound (``time.monotonic()``, the end of ``server.shutdown_grace_seconds``): no handler runs
        past ``at``; one still running then is stopped as at its deadline (a write's key turns unknown), and
        ``drain`` waits for nothing past it."""
        self.dispatcher.stop_by(at)

    async def drain(self) -> None:
        """Let started writes finish and be recorded (each is bounded by its own deadline and by ``stop_by``;
        one that outlived its deadline is waited for until ``stop_by``'s moment, not at all without it)."""
        await self.idempotency.drain(until=self.dispatcher.stop_at)

    async def aclose(self) -> None:
        """``drain``, then close every stage that has an ``aclose`` (``Chain.aclose``: the last first, so the
        dispatch stage releases the handler pool and stops the worker processes, the idempotency stage stops
        the expiry of its records), then, even if one of them failed, close the store and the policy engine
        and export the spans still queued."""
        await self.drain()
        try:
            await self.chain.aclose()
        finally:
            await self.store.aclose()
            await self.policy.aclose()
            await self.tracing.aclose()
