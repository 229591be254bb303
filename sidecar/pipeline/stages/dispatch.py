"""Stage 10, dispatch: the last stage; runs the handler within the call's deadline and shapes its result.

The deadline is ``call.handler_deadline()``: the tool's timeout or the caller's deadline, whichever comes
first, but for a write (a detached call) its tool's timeout alone; such a write does not start once its
caller's deadline has passed. Retries, cancellation, the thread pool for sync handlers and the worker
processes of isolated ones are ``sidecar.tools.dispatch.Dispatcher``'s. When the sidecar traces, the handler
runs in a span ``handler {tool}`` (attribute ``toolbooth.attempts``).
It sets ``call.dispatched`` (``Dispatched``): the handler's attempts; whether its outcome is not known (it outlived
the deadline, or its worker process died); for one that runs on (a sync write's thread), its own result once it
ends, for the idempotency stage to store; the labels the handler added to its output (``ToolContext.add_label``),
which a result that does not give it (too large) does not carry.
``aclose`` releases the handler pool and stops the worker processes.
"""

from __future__ import annotations

import asyncio

from sidecar.config import Limits
from sidecar.contract import ToolResult
from sidecar.pipeline import results
from sidecar.pipeline.call import Call, Dispatched
from sidecar.pipeline.chain import Next
from sidecar.tools.dispatch import Dispatcher, Outcome

__all__ = ["DispatchStage"]


class DispatchStage:
    """Ends every call that gets this far with the handler's outcome."""

    def __init__(self, dispatcher: Dispatcher, limits: Limits) -> None:
        self._dispatcher, self._limits = dispatcher, limits

    async def run(self, call: Call, next: Next) -> ToolResult:
        with call.span("handler", call.defn.name) as span:
            outcome = await self._dispatcher.run(call.defn, call.validated.model,
                                                 call.context(call.handler_deadline()), start_by=call.caller_deadline)
            if span is not None:
                span.set_attribute("toolbooth.attempts", outcome.attempts)
        late = None if outcome.late is None else asyncio.ensure_future(self._late(call, outcome.late))
        call.dispatched = Dispatched(outcome.attempts, outcome.unknown, late, outcome.labels)
        return self._result(call, outcome)

    async def aclose(self) -> None:
        """Release the handler pool and stop the worker processes."""
        await self._dispatcher.aclose()

    async def _late(self, call: Call, late: asyncio.Future[Outcome]) -> ToolResult:
        return self._result(call, await late)

    def _result(self, call: Call, outcome: Outcome) -> ToolResult:
        if outcome.error is not None:
            return results.error(call, outcome.error)
        assert outcome.output is not None
        return results.success(call, outcome.output.model_dump(mode="json"), max_bytes=self._limits.max_result_bytes,
                               failed=outcome.failed)
