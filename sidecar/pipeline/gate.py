"""``Pipeline``: the one entry every transport calls (list tools, execute one call, look up an operation).

It holds no stage logic: ``execute`` makes a ``Call`` and runs it through the chain that
``sidecar.bootstrap`` built; ``list_tools`` asks the resolve stage, which owns availability at
discovery as at execution. Denials and failures of a call are ``ToolResult``s; the only exceptions
that leave ``list_tools`` and ``get_operation`` are ``InvalidRequestError`` for a malformed string
field (``sidecar.pipeline.fields``: checked before any policy or store is asked) and
``DependencyError``s (fail closed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sidecar.config import Limits
from sidecar.contract import CallRequest, Operation, Principal, ToolListing, ToolResult
from sidecar.errors import StoreUnavailableError
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Chain
from sidecar.pipeline.fields import check_fields
from sidecar.pipeline.operations import find_operation
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.resolve import ResolveStage
from sidecar.policy import PolicyEngine
from sidecar.state import Expiry, Store
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
    expiry: Expiry

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing:
        """The tools the availability policy shows ``principal``, decided in one pass."""
        check_fields(conversation_id=conversation_id)
        return await self.resolve.listing(principal, conversation_id=conversation_id)

    async def execute(self, principal: Principal, request: CallRequest, *,
                      caller_deadline: float | None = None) -> ToolResult:
        """Run ``request`` through every stage and return its typed result."""
        return await self.chain(Call(principal, request, self.policy.revision, caller_deadline))

    async def get_operation(self, principal: Principal, *, tool: str | None = None, key: str | None = None,
                            request_id: str | None = None) -> Operation:
        """Where ``principal``'s keyed call stands, by ``request_id`` or by ``tool`` and ``key``."""
        check_fields(tool=tool, idempotency_key=key, request_id=request_id)
        try:
            return await find_operation(self.store, principal, tool=tool, key=key, request_id=request_id)
        except StoreUnavailableError as exc:
            log.error("store unavailable during GetOperation: %s", exc)
            raise

    async def aclose(self) -> None:
        """Let started writes finish and be recorded, then release the handler pool and stop the worker
        processes, close the store and the policy engine (each write is bounded by its own deadline)."""
        await self.idempotency.drain()
        await self.dispatcher.aclose()
        await self.expiry.aclose()
        await self.store.aclose()
        await self.policy.aclose()
