"""``ExecuteToolStream`` through a real server: progress then the result, rate limiting, cancelling a read or a write.

The handlers report with ``ctx.report_progress`` (``count_up``, ``turn``) or, sync, with
``ctx.report_progress_sync`` (``count_up_sync``); they are held and let go by the test where it matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient, Client, ClientError
from sidecar.config import Settings
from sidecar.contract import ErrorCode, OperationState, Progress, Status, ToolEvent, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.server.interceptors.status import UNDECODABLE_DETAILS
from sidecar.state import AuditEvent
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.tools import TICKETS
from tests.support.waiting import until

pytestmark = pytest.mark.integration


@dataclass
class Served:
    pipeline: Pipeline
    client: AsyncClient
    address: str

    async def events(self) -> list[AuditEvent]:
        return await self.pipeline.store.audit_events()  # type: ignore[attr-defined, no-any-return]

    async def stream(self, tool: str, arguments: Any, **fields: Any) -> list[ToolEvent]:
        return [event async for event in self.client.execute_stream(tool, arguments, **fields)]


@pytest.fixture
async def serve(make_settings: Callable[..., Settings], start_sidecar: Any) -> AsyncIterator[Callable[..., Any]]:
    """``await serve(**limits)``: a started sidecar with those ``limits``; ``TICKETS`` reset, ``HOLD`` closed."""
    made: list[tuple[Pipeline, AsyncClient]] = []
    TICKETS.reset()
    tools.HOLD.close()

    async def start(**limits: Any) -> Served:
        settings = make_settings(limits=limits)
        pipeline = await open_pipeline(settings, registry=Registry.from_tools([*tools.ALL, *tools.BATCH_AND_STREAM]))
        sidecar = await start_sidecar(settings, pipeline)
        client = AsyncClient(sidecar.addresses[0], timeout=30)
        made.append((pipeline, client))
        return Served(pipeline, client, sidecar.addresses[0])

    yield start
    tools.HOLD.open()
    TICKETS.release(*TICKETS.started)
    for pipeline, client in made:
        await client.close()
        await pipeline.aclose()


def split(events: list[ToolEvent]) -> tuple[list[Progress], ToolResult]:
    """The progress events and the result, checking that the result comes last and only once."""
    *reports, result = events
    assert isinstance(result, ToolResult), events
    assert all(isinstance(report, Progress) for report in reports), events
    return reports, result  # type: ignore[return-value]


async def test_progress_events_then_the_result(serve: Any) -> None:
    served = await serve(progress_events_per_second=1000)
    reports, result = split(await served.stream("count_up", {"count": 20}))
    assert (result.status, result.data) == (Status.SUCCESS, {"count": 20})
    assert reports and reports[-1] == Progress(progress=20, total=20, message="20 of 20")
    values = [report.progress for report in reports]
    assert values == sorted(set(values)), "reports out of order or repeated"


async def test_the_stream_on_the_wire_is_progress_oneofs_then_one_result(serve: Any) -> None:
    served = await serve()
    async with grpc.aio.insecure_channel(served.address) as channel:
        stream = pb_grpc.ToolServiceStub(channel).ExecuteToolStream(
            pb.ExecuteToolRequest(tool="count_up_sync", arguments_json='{"count": 300}'), timeout=10)
        events = [event async for event in stream]
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[-1] == "result" and set(kinds[:-1]) == {"progress"}
    last = events[-2].progress
    assert (last.progress, last.HasField("total"), last.message) == (300, False, "")  # no total, no message
    assert events[-1].result.status == pb.STATUS_SUCCESS


async def test_a_chatty_handler_yields_a_bounded_number_of_events_and_the_last_one(serve: Any) -> None:
    served = await serve(progress_events_per_second=20)
    began = time.monotonic()
    reports, result = split(await served.stream("count_up", {"count": 10_000}))
    elapsed = time.monotonic() - began
    assert result.status is Status.SUCCESS
    assert reports[-1] == Progress(progress=10_000, total=10_000, message="10000 of 10000")
    # the first at once, then at most 20 per second, and the last one before the result
    assert len(reports) <= 2 + int(elapsed * 20), (len(reports), elapsed)


async def test_a_sync_handler_reports_from_its_thread(serve: Any) -> None:
    served = await serve(progress_events_per_second=20)
    began = time.monotonic()
    reports, result = split(await served.stream("count_up_sync", {"count": 5000}))
    elapsed = time.monotonic() - began
    assert (result.status, reports[-1]) == (Status.SUCCESS, Progress(progress=5000))
    assert len(reports) <= 2 + int(elapsed * 20), (len(reports), elapsed)


async def test_reports_of_a_unary_call_go_nowhere(serve: Any) -> None:
    served = await serve()
    result = await served.client.execute("count_up", {"count": 50})
    assert (result.status, result.data) == (Status.SUCCESS, {"count": 50})


async def test_a_refused_call_streams_its_result_alone(serve: Any) -> None:
    served = await serve()
    [denied] = await served.stream("delete_records", {"text": "x"})
    assert isinstance(denied, ToolResult) and denied.error is not None
    assert denied.error.code is ErrorCode.PERMISSION_DENIED


async def test_cancelling_the_stream_cancels_a_read(serve: Any) -> None:
    served = await serve()
    events = served.client.execute_stream("turn", {"name": "r"})
    async with contextlib.aclosing(events):
        first = await anext(events)
        assert first == Progress(progress=0, message="r started")
    await TICKETS.seen(lambda t: t.cancelled == ["r"], "the read's handler cancelled")

    async def audited() -> bool:
        return [e.status for e in await served.events()] == ["cancelled"]

    await until(audited, what="the cancelled call audited")


async def test_cancelling_the_stream_of_a_started_write_lets_it_finish_and_be_recorded(serve: Any) -> None:
    served = await serve()
    started, done = tools.HELD_STARTED.value, tools.HELD_DONE.value
    events = served.client.execute_stream("held_note", {"text": "w"}, idempotency_key="w-s")
    waiting = asyncio.ensure_future(anext(events))
    await tools.HELD_STARTED.reached(started + 1)
    waiting.cancel()  # the caller leaves while the write runs, before any event
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await events.aclose()
    tools.HOLD.open()

    async def completed() -> bool:
        return (await served.client.get_operation("held_note", "w-s")).state is OperationState.COMPLETED

    await until(completed, what="the write recorded")
    replay = await served.client.execute("held_note", {"text": "w"}, idempotency_key="w-s")
    assert (replay.meta.idempotency_replayed, replay.data) == (True, {"count": done + 1})
    assert tools.HELD_STARTED.value == started + 1
    assert [e.status for e in await served.events()] == ["dispatching", "success", "success"]  # the write, its replay


async def test_a_stream_without_a_tool_or_undecodable_is_invalid_argument(serve: Any) -> None:
    served = await serve()
    with pytest.raises(ClientError) as caught:
        await served.stream("", {})
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, "tool is required")
    async with grpc.aio.insecure_channel(served.address) as channel:
        raw = channel.unary_stream("/toolbooth.v1.ToolService/ExecuteToolStream")
        with pytest.raises(grpc.aio.AioRpcError) as undecodable:
            [event async for event in raw(b"\x0a\x05\xff\xfe\xfd\xfc\xfb", timeout=10)]
    assert (undecodable.value.code(), undecodable.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                                       UNDECODABLE_DETAILS)


async def test_the_blocking_client_streams_too(serve: Any) -> None:
    served = await serve()

    def stream() -> list[ToolEvent]:
        with Client(served.address, timeout=10) as client:
            return list(client.execute_stream("count_up", {"count": 3}))

    reports, result = split(await asyncio.to_thread(stream))
    assert (result.data, reports[-1].progress) == ({"count": 3}, 3)
