"""``ToolGateway``: what every transport (gRPC, MCP, HTTP/JSON) calls; the pipeline is one.

A transport authenticates its caller, turns its request into a ``CallRequest`` (``sidecar.contract``) and
gives both to the gateway; every decision lives behind it, and its answer is a typed result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sidecar.contract import CallBatch, CallRequest, Operation, Principal, Progress, ToolListing, ToolResult

__all__ = ["TOOL_REQUIRED", "ToolGateway"]

TOOL_REQUIRED = "tool is required"  # what every transport answers a call that names no tool


class ToolGateway(Protocol):
    """What a transport needs from the pipeline."""

    async def list_tools(self, principal: Principal, *, conversation_id: str | None = None) -> ToolListing: ...

    async def execute(
        self, principal: Principal, request: CallRequest, *, caller_deadline: float | None = None
    ) -> ToolResult: ...

    async def execute_batch(
        self, principal: Principal, batch: CallBatch, *, caller_deadline: float | None = None
    ) -> tuple[ToolResult, ...]: ...

    async def execute_streamed(
        self, principal: Principal, request: CallRequest, send: Callable[[Progress], Awaitable[None]], *,
        caller_deadline: float | None = None,
    ) -> ToolResult: ...

    async def get_operation(self, principal: Principal, *, tool: str | None = None, key: str | None = None,
                            request_id: str | None = None) -> Operation: ...
