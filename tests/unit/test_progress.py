"""Progress reports: ``ToolContext.report_progress``, the feed that coalesces them, and a streamed call in process."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest

from sidecar.contract import CallRequest, OperationState, Progress, ToolResult
from sidecar.pipeline.progress import ProgressFeed, stream_call
from sidecar.plugin import ToolContext
from sidecar.state import KeyScope
from sidecar.tools.registry import Registry
from tests.conftest import DEVELOPER, PipelineFactory
from tests.support import tools
from tests.support.waiting import until


class Recorder:
    """A progress sink that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[Progress] = []

    def report(self, update: Progress) -> None:
        self.reports.append(update)


def context(sink: Recorder | None = None) -> ToolContext:
    return ToolContext(principal=DEVELOPER, request_id="r-1", deadline=time.monotonic() + 5, idempotency_key=None,
                       attempt=1, logger=logging.LoggerAdapter(logging.getLogger("t"), {}), progress_sink=sink)


async def test_a_report_reaches_the_sink_and_is_a_no_op_without_one() -> None:
    sink = Recorder()
    await context(sink).report_progress(3, total=10, message="three")
    context(sink).report_progress_sync(4)
    assert sink.reports == [Progress(progress=3, total=10, message="three"), Progress(progress=4)]
    assert await context().report_progress(1) is None  # a unary call: nowhere to go


def test_a_context_built_as_before_has_no_sink() -> None:
    ctx = ToolContext(principal=DEVELOPER, request_id="r-1", deadline=0.0, idempotency_key=None, attempt=1,
                      logger=logging.LoggerAdapter(logging.getLogger("t"), {}))
    assert ctx.progress_sink is None and "progress_sink" not in repr(ctx)


@pytest.mark.parametrize(("progress", "total", "message"), [
    (float("nan"), None, None), (float("inf"), None, None), (1, float("-inf"), None), (True, None, None),
    ("5", None, None), (1, "10", None), (1, None, 7), (1, None, "x" * 1001),
], ids=["nan", "inf", "infinite total", "bool", "text", "text total", "message not text", "message too long"])
async def test_a_bad_report_is_a_value_error_even_without_a_sink(progress: Any, total: Any, message: Any) -> None:
    for ctx in (context(Recorder()), context()):
        with pytest.raises(ValueError, match="validation error for Progress"):
            await ctx.report_progress(progress, total=total, message=message)


async def test_reports_between_two_sends_are_coalesced_into_the_latest() -> None:
    sent: list[Progress] = []
    first_sent, finish = asyncio.Event(), asyncio.Event()

    async def send(update: Progress) -> None:
        sent.append(update)
        first_sent.set()

    async def execute(sink: Any) -> ToolResult:
        sink.report(Progress(progress=1))
        await first_sent.wait()
        for n in (2, 3, 4):  # within the same window: only the last one is sent
            sink.report(Progress(progress=n))
        await finish.wait()
        return "done"  # type: ignore[return-value]

    call = asyncio.ensure_future(stream_call(execute, send, per_second=0.001))  # a window of 1000 s
    await until(lambda: len(sent) == 1, what="the first report sent at once")
    finish.set()
    assert await call == "done"
    assert sent == [Progress(progress=1), Progress(progress=4)]  # the last one, before the result


async def test_a_report_from_a_thread_wakes_the_sender_and_one_after_the_result_is_dropped() -> None:
    feed = ProgressFeed()
    thread = threading.Thread(target=feed.report, args=(Progress(progress=7),))
    thread.start()
    thread.join()
    await asyncio.wait_for(feed.ready.wait(), timeout=5)
    assert feed.take() == Progress(progress=7) and feed.take() is None
    assert feed.close() is None
    feed.report(Progress(progress=8))
    assert feed.take() is None and not feed.ready.is_set()


async def test_a_cancelled_stream_cancels_its_read(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, *tools.BATCH_AND_STREAM]))
    tools.TICKETS.reset()
    sent: list[Progress] = []

    async def send(update: Progress) -> None:
        sent.append(update)

    task = asyncio.ensure_future(pipeline.execute_streamed(DEVELOPER, turn_request("r"), send))
    await until(lambda: sent == [Progress(progress=0, message="r started")], what="the read's first report")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: tools.TICKETS.cancelled == ["r"], what="the read's handler cancelled")
    assert [e.status for e in await pipeline.store.audit_events()] == ["cancelled"]  # type: ignore[attr-defined]


async def test_a_cancelled_stream_lets_its_started_write_finish(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, *tools.BATCH_AND_STREAM]))
    tools.HOLD.close()
    started, done = tools.HELD_STARTED.value, tools.HELD_DONE.value
    request = CallRequest(tool="held_note", arguments_json='{"text": "w"}', idempotency_key="w-1")

    async def send(update: Progress) -> None:
        raise AssertionError("held_note reports nothing")

    task = asyncio.ensure_future(pipeline.execute_streamed(DEVELOPER, request, send))
    await tools.HELD_STARTED.reached(started + 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # the caller is gone for sure
    tools.HOLD.open()
    scope = KeyScope(DEVELOPER.tenant, DEVELOPER.id, "held_note", "w-1")

    async def stored() -> bool:
        record = await pipeline.store.operation(scope)
        return record is not None and record.state is OperationState.COMPLETED

    await until(stored, what="the write's result stored")
    replay = await pipeline.execute(DEVELOPER, request)
    assert (replay.meta.idempotency_replayed, replay.data) == (True, {"count": done + 1})


def turn_request(name: str) -> CallRequest:
    return CallRequest(tool="turn", arguments_json=json.dumps({"name": name}))
