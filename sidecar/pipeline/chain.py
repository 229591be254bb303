"""The chain of stages one call goes through, in the style of temporalio's interceptors.

A stage is an object with ``async def run(call, next) -> ToolResult``: it gets the ``Call`` and
the rest of the chain as ``next``, and either passes the call on (``return await next(call)``,
doing its work before and/or after) or ends it. It ends a call by returning a ``ToolResult`` or
by raising ``CallRefused`` with typed errors; the chain turns a refusal into a result right at
the stage that raised it (``results.refused``), so every stage before it sees a ``ToolResult``,
never an exception, and can audit or store it.

Transports and tools build the chain they need from the same stage objects
(``sidecar.pipeline.gate`` for real calls, ``sidecar.pipeline.dry_run`` for
``toolbooth policy eval``); the last stage must end every call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from sidecar.contract import ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call
from sidecar.pipeline.results import refused

__all__ = ["CallStage", "Chain", "Next"]

Next = Callable[[Call], Awaitable[ToolResult]]


class CallStage(Protocol):
    """One stage of a call (DESIGN.md, stages 2-9)."""

    async def run(self, call: Call, next: Next) -> ToolResult:
        """Do this stage's work on ``call``, passing it on with ``next`` or ending it."""
        ...


class Chain:
    """Stages linked in order; calling the chain runs the first one."""

    def __init__(self, stages: Sequence[CallStage]) -> None:
        self.stages = tuple(stages)
        self._first: Next = _end
        for stage in reversed(self.stages):
            self._first = _link(stage, self._first)

    async def __call__(self, call: Call) -> ToolResult:
        """Run ``call`` through every stage; its typed result."""
        return await self._first(call)


def _link(stage: CallStage, next: Next) -> Next:
    async def run(call: Call) -> ToolResult:
        try:
            return await stage.run(call, next)
        except CallRefused as refusal:
            return refused(call, refusal)

    return run


async def _end(call: Call) -> ToolResult:
    raise AssertionError(f"no stage ended the call of {call.request.tool!r}: the chain's last stage must")
