"""A write still queued for a handler thread when its caller's deadline passes never starts.

A write's own deadline is its tool's timeout (it runs on once started), but until its handler starts it is
bounded by its caller's deadline too: one waiting in the thread pool then is taken out of the queue, its key
released (``TIMEOUT``, nothing ran), and it does not start when a thread frees later.
"""

from __future__ import annotations

import asyncio
import threading
import time

from sidecar.contract import CallRequest, ErrorCode, Status
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.state import KeyScope
from sidecar.tools.registry import Registry
from tests.conftest import DEVELOPER, PipelineFactory
from tests.support import tools

WAIT = 10.0  # seconds: the deadline of every wait for an event
RAN = tools.Counter()
HOLD = threading.Event()


@tool(name="blocking_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=30)
def blocking_note(args: tools.Text, ctx: ToolContext) -> tools.Count:
    """A sync write that counts its executions, then holds its thread until the test sets ``HOLD``."""
    number = RAN.bump()
    HOLD.wait(WAIT)
    return tools.Count(count=number)


def note(key: str) -> CallRequest:
    return CallRequest(tool="blocking_note", arguments_json=f'{{"text": "{key}"}}', idempotency_key=key)


async def test_a_write_queued_for_a_thread_past_its_callers_deadline_never_runs(
        make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, blocking_note]), sync_handler_threads=1)
    HOLD.clear()
    before = RAN.value
    busy = asyncio.create_task(pipeline.execute(DEVELOPER, note("busy")))
    try:
        await RAN.reached(before + 1, timeout=WAIT)  # the one thread is taken
        queued = asyncio.create_task(pipeline.execute(DEVELOPER, note("queued"),
                                                      caller_deadline=time.monotonic() + 0.2))
        await asyncio.wait({queued}, timeout=WAIT)
        assert queued.done(), "the queued write was still waiting for a thread after its caller's deadline"
    finally:
        HOLD.set()
    result = queued.result()
    assert result.error is not None and result.error.code is ErrorCode.TIMEOUT and result.meta.attempt == 0, result
    assert result.error.message == "the call's deadline passed before the tool ran" and result.error.retryable
    assert (await busy).status is Status.SUCCESS
    after = await pipeline.execute(DEVELOPER, note("after"))  # queued behind the other, if it were still queued
    assert after.status is Status.SUCCESS and after.data == {"count": before + 2}, after
    assert RAN.value == before + 2  # the queued write never ran
    assert await pipeline.store.operation(KeyScope(DEVELOPER.tenant, DEVELOPER.id, "blocking_note", "queued")) is None
    again = await pipeline.execute(DEVELOPER, note("queued"))  # its key was released: it runs now
    assert again.status is Status.SUCCESS and again.data == {"count": before + 3}, again
