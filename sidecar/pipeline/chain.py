"""The chain of stages one call goes through, in the style of temporalio's interceptors.

A stage is an object with ``async def run(call, next) -> ToolResult`` (``CallStage``, which says what a stage
may rely on): it gets the ``Call`` and the rest of the chain as ``next``, and either passes the call on
(``return await next(call)``, doing its work before and/or after) or ends it. The order of a real call's
stages, and their numbering, is ``sidecar.pipeline.order``'s; transports and tools build the chain they need
from the same stage objects (``sidecar.bootstrap`` for real calls, ``sidecar.pipeline.dry_run`` for
``toolbooth policy eval``); the last stage must end every call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from sidecar.contract import ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call
from sidecar.pipeline.results import refused

__all__ = ["CallStage", "Chain", "ClosingStage", "Next"]

log = logging.getLogger("toolbooth.pipeline")

Next = Callable[[Call], Awaitable[ToolResult]]


class CallStage(Protocol):
    """One stage of a call (``sidecar.pipeline.order`` numbers them 0-10 and names the slots of added ones).

    **Ending a call.** A stage ends the call by returning a ``ToolResult`` (``sidecar.pipeline.results`` builds
    every one) or by raising ``CallRefused`` with typed errors: the chain turns a refusal into a result right
    at the stage that raised it (``results.refused``), so every stage before it sees a ``ToolResult``, never
    an exception, and can audit, count or store it. Any other exception is a bug; it leaves the chain.

    **Order.** Each stage runs inside the ones before it: its work before ``next`` happens after theirs, its
    work after ``next`` before theirs. Stages added in one slot run in the order given.

    **Which calls reach it**, by slot (``sidecar.pipeline.order.Stages``):

    - ``observers`` (stage 0): every call, refused or not, and its result; a call whose caller went away
      raises ``asyncio.CancelledError`` out of ``next``. On the way in nothing is known of the call but its
      input (no record of ``Call`` is set; on the way out, those of the stages it reached are); an observer
      should not refuse, since audit (stage 1) would not see it.
    - ``before_decisions`` (after stage 2): every call whose string fields are well-formed; it is audited
      whatever it returns. No tool is resolved (``call.tool`` is ``None``) and no policy has decided.
    - ``after_decisions`` (after stage 7): only calls of a tool available to the caller (``call.defn``), with
      valid arguments (``call.validated``), that the authz policy allows, and either need no approval or carry
      one that was checked, not yet spent (``call.approved``). A write's key is not claimed yet
      (``call.claim`` is ``None``): a refusal here leaves it free.
    - ``before_dispatch`` (after stage 9): only calls about to run. A write (a tool that requires an
      idempotency key) gets here only once it owns its key (``call.claim``), never for a replayed,
      in-progress or reused one, and after its dispatch was audited and its approval spent; a refusal here
      releases the key and gives the approval back (nothing ran: a retry with the key runs).

    A stage reads the records of ``Call`` that the stages before it set (``sidecar.pipeline.call``) and never
    sets another stage's: each is set once, by the stage that owns it.

    **Cancellation.** Up to stage 8 a call runs in its caller's task: a caller that goes away cancels it
    (``CancelledError`` through ``next``). From stage 8 on, a write runs detached from its caller's
    cancellation (``call.detached``): a started write runs to its end, and its outcome is stored and audited,
    even if the caller leaves or its deadline passes; its caller only stops waiting. A read is never detached.

    **Closing.** A stage that holds resources has ``async def aclose()`` (``ClosingStage``): ``Pipeline.aclose``
    closes it once, after the started writes drained, the last stage of the chain first.
    """

    async def run(self, call: Call, next: Next) -> ToolResult:
        """Do this stage's work on ``call``, passing it on with ``next`` or ending it."""
        ...


@runtime_checkable
class ClosingStage(CallStage, Protocol):
    """A stage that holds resources, closed with its pipeline."""

    async def aclose(self) -> None:
        """Release what the stage holds; calls no longer reach it."""
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

    async def aclose(self) -> None:
        """Close every stage that has an ``aclose``, each once, the last stage first. One that fails does not
        keep the others open: each failure is logged, and the first is raised once all were closed."""
        closing = {id(stage): stage for stage in reversed(self.stages) if isinstance(stage, ClosingStage)}
        failures: list[Exception] = []
        for stage in closing.values():
            try:
                await stage.aclose()
            except Exception as exc:  # noqa: BLE001 - raised once the other stages are closed
                log.error("stage %s failed to close: %r", type(stage).__name__, exc)
                failures.append(exc)
        if failures:
            raise failures[0]


def _link(stage: CallStage, next: Next) -> Next:
    async def run(call: Call) -> ToolResult:
        try:
            return await stage.run(call, next)
        except CallRefused as refusal:
            return refused(call, refusal)

    return run


async def _end(call: Call) -> ToolResult:
    raise AssertionError(f"no stage ended the call of {call.request.tool!r}: the chain's last stage must")
