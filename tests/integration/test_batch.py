"""``ExecuteToolBatch`` through a real server: order, concurrency, cancellation, per-call gating and audit, bounds.

Handlers are held and let go by the test (``tests.support.tools.TICKETS``, ``HOLD``), so what runs at
once and what is cancelled is observed, never guessed from timing.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient, ClientError, call_request
from sidecar.config import Settings
from sidecar.contract import CallRequest, ErrorCode, OperationState, Recovery, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.pipeline.batch import EMPTY_BATCH
from sidecar.server.interceptors.status import UNDECODABLE_DETAILS
from sidecar.state import AuditEvent
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.tools import TICKETS
from tests.support.waiting import until

pytestmark = pytest.mark.integration


@dataclass
class Served:
    """A real sidecar over the real pipeline (the test tools and those of the batch tests), and a client."""

    pipeline: Pipeline
    client: AsyncClient
    address: str

    async def events(self) -> list[AuditEvent]:
        return await self.pipeline.store.audit_events()  # type: ignore[attr-defined, no-any-return]

    async def outcomes(self, count: int) -> list[AuditEvent]:
        """Wait until ``count`` calls have their outcome event; all outcome events."""
        found: list[AuditEvent] = []

        async def enough() -> bool:
            found[:] = [e for e in await self.events() if e.status != "dispatching"]
            return len(found) >= count

        await until(enough, what=f"{count} outcome events")
        return found

    def batch(self, *calls: CallRequest, **options: Any) -> asyncio.Task[list[ToolResult]]:
        return asyncio.ensure_future(self.client.execute_batch(calls, **options))


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


def turn(name: str, *, fail: bool = False) -> CallRequest:
    return call_request("turn", {"name": name, "fail": fail})


def code(result: ToolResult) -> ErrorCode | None:
    return None if result.error is None else result.error.code


# --- order and concurrency -------------------------------------------------------------------------------------


async def test_results_come_back_in_request_order_whatever_finishes_first(serve: Any) -> None:
    served = await serve()
    task = served.batch(turn("slowest"), call_request("echo", {"text": "a"}), turn("slower"),
                        call_request("echo_sync", {"text": "b"}), call_request("slow", {"count": 1}))
    finished = await served.outcomes(3)  # the echoes and slow end while both turns are held
    assert sorted(e.tool for e in finished) == ["echo", "echo_sync", "slow"]
    await TICKETS.seen(lambda t: len(t.started) == 2, "both turns running")
    TICKETS.release("slower")
    assert [e.tool for e in await served.outcomes(4)][-1] == "turn"
    TICKETS.release("slowest")
    results = await task
    assert [r.meta.tool for r in results] == ["turn", "echo", "turn", "echo_sync", "slow"]
    assert [r.data for r in results] == [{"text": "slowest"}, {"text": "a", "principal": "dev", "attempt": 1},
                                         {"text": "slower"}, {"text": "b", "principal": "dev", "attempt": 1},
                                         {"count": 1}]
    assert len({r.meta.request_id for r in results}) == 5


@pytest.mark.parametrize(("asked", "cap", "expected"), [(2, 16, 2), (0, 3, 3), (10, 3, 3)],
                         ids=["as asked", "0 is the configured default", "capped by the configuration"])
async def test_max_concurrency_is_honoured(serve: Any, asked: int, cap: int, expected: int) -> None:
    served = await serve(max_batch_concurrency=cap)
    names = [f"t{i}" for i in range(expected + 3)]
    task = served.batch(*(turn(name) for name in names), max_concurrency=asked)
    await TICKETS.seen(lambda t: len(t.started) == expected and t.running == expected, f"{expected} turns running")
    for started in range(expected + 1, len(names) + 1):  # letting the oldest one go lets exactly one more in
        TICKETS.release(TICKETS.started[started - expected - 1])
        await TICKETS.seen(lambda t, n=started: len(t.started) == n and t.running == expected,
                           f"{started} turns started, {expected} running")
    TICKETS.release(*names)
    results = await task
    assert [r.status for r in results] == [Status.SUCCESS] * len(names)
    assert TICKETS.most == expected


# --- cancel_on_permanent_failure -------------------------------------------------------------------------------


async def test_a_permanent_failure_cancels_waiting_and_running_reads_but_a_started_write_finishes(serve: Any) -> None:
    served = await serve()
    started, done = tools.HELD_STARTED.value, tools.HELD_DONE.value
    task = served.batch(call_request("held_note", {"text": "w"}, idempotency_key="w-1"), turn("a"),
                        turn("f", fail=True), turn("b"), turn("c"), call_request("echo", {"text": "e"}),
                        max_concurrency=4, cancel_on_permanent_failure=True)
    await tools.HELD_STARTED.reached(started + 1)  # the write runs, held, with its key claimed
    await TICKETS.seen(lambda t: sorted(t.started) == ["a", "b", "f"], "three turns running")
    TICKETS.release("f")  # fails permanently
    await TICKETS.seen(lambda t: sorted(t.cancelled) == ["a", "b"], "the running reads cancelled")
    assert not task.done(), "the batch returned before its started write finished"
    assert (await served.client.get_operation("held_note", "w-1")).state is OperationState.IN_PROGRESS
    tools.HOLD.open()
    results = await task
    write, a, failed, b, c, echo = results
    assert (write.status, write.data) == (Status.SUCCESS, {"count": done + 1})
    assert code(failed) is ErrorCode.RESOURCE_NOT_FOUND
    for cancelled, how in [(a, "was stopped before it ended"), (b, "was stopped before it ended"),
                           (c, "never started"), (echo, "never started")]:
        error = cancelled.error
        assert error is not None and error.code is ErrorCode.CANCELLED
        assert (error.retryable, error.recovery) == (True, Recovery.RETRY_SAME_REQUEST)
        assert "calls[2]" in error.message and how in error.message
    assert "c" not in TICKETS.started and tools.HELD_DONE.value == done + 1
    replay = await served.client.execute("held_note", {"text": "w"}, idempotency_key="w-1")
    assert (replay.meta.idempotency_replayed, replay.data) == (True, write.data)
    assert tools.HELD_STARTED.value == started + 1
    by_call = _by_request(await served.events())
    assert [by_call[r.meta.request_id] for r in results] == [
        [("dispatching", None), ("success", None)], [("cancelled", None)], [("error", "RESOURCE_NOT_FOUND")],
        [("cancelled", None)], [("cancelled", None)], [("cancelled", None)]]


async def test_without_cancellation_a_permanent_failure_stops_nothing(serve: Any) -> None:
    served = await serve()
    task = served.batch(turn("f", fail=True), turn("a"))
    await TICKETS.seen(lambda t: sorted(t.started) == ["a", "f"], "both turns running")
    TICKETS.release("f")
    await served.outcomes(1)
    TICKETS.release("a")
    failed, other = await task
    assert (code(failed), other.status, other.data) == (ErrorCode.RESOURCE_NOT_FOUND, Status.SUCCESS, {"text": "a"})
    assert TICKETS.cancelled == []


async def test_neither_approval_required_nor_a_retryable_error_cancels(serve: Any) -> None:
    served = await serve()
    tools.HOLD.open()
    task = served.batch(call_request("send_email", {"text": "hi"}, idempotency_key="m-1"),
                        call_request("flaky", {"count": 9}), turn("a"), cancel_on_permanent_failure=True)
    assert sorted(e.status for e in await served.outcomes(2)) == ["approval_required", "error"]
    TICKETS.release("a")
    approval, flaky, read = await task
    assert approval.status is Status.APPROVAL_REQUIRED and approval.preview is not None
    assert code(flaky) is ErrorCode.SERVICE_UNAVAILABLE and flaky.error is not None and flaky.error.retryable
    assert (read.status, TICKETS.cancelled) == (Status.SUCCESS, [])


# --- each call on its own ---------------------------------------------------------------------------------------


async def test_each_call_is_authorized_and_audited_on_its_own(serve: Any) -> None:
    served = await serve()
    results = await served.batch(call_request("echo", {"text": "hi"}, call_id="m-1"),
                                 call_request("delete_records", {"text": "x"}, call_id="m-2"),
                                 call_request("create_note", {"text": "n"}, idempotency_key="k-a", call_id="m-3",
                                              conversation_id="c-1"))
    ok, denied, write = results
    assert (ok.status, code(denied), write.status) == (Status.SUCCESS, ErrorCode.PERMISSION_DENIED, Status.SUCCESS)
    events = await served.events()
    assert len({e.request_id for e in events}) == 3
    outcome = {e.request_id: e for e in events if e.status != "dispatching"}
    for result, call_id, status in [(ok, "m-1", "success"), (denied, "m-2", "error"), (write, "m-3", "success")]:
        event = outcome[result.meta.request_id]
        assert (event.call_id, event.status, event.tool) == (call_id, status, result.meta.tool)
        assert set(json.loads(event.decisions_json)) >= {"availability", "authz"}
    assert outcome[denied.meta.request_id].error_code == "PERMISSION_DENIED"
    assert outcome[write.meta.request_id].conversation_id == "c-1"
    assert [e.status for e in events if e.request_id == write.meta.request_id] == ["dispatching", "success"]


async def test_a_hidden_tool_in_a_batch_is_indistinguishable_from_an_unknown_one(serve: Any) -> None:
    served = await serve()
    hidden, unknown = await served.batch(call_request("admin_console", {"text": "x"}),
                                         call_request("no_such_tool", {"text": "x"}))
    assert hidden.error is not None and hidden.error.code is ErrorCode.TOOL_UNAVAILABLE

    def shape(result: ToolResult, name: str) -> str:
        return json.dumps(result.model_dump(mode="json", exclude={"meta": {"request_id", "duration_ms"}})).replace(
            name, "NAME")

    assert shape(hidden, "admin_console") == shape(unknown, "no_such_tool")
    alone = await served.client.execute("admin_console", {"text": "x"})
    assert shape(hidden, "admin_console") == shape(alone, "admin_console")  # as in a call of its own


async def test_the_same_key_twice_at_once_runs_once_the_other_is_in_progress(serve: Any) -> None:
    served = await serve()
    started = tools.HELD_STARTED.value
    task = served.batch(*[call_request("held_note", {"text": "x"}, idempotency_key="dup")] * 2,
                        cancel_on_permanent_failure=True)
    await tools.HELD_STARTED.reached(started + 1)
    [busy] = await served.outcomes(1)
    assert busy.error_code == "OPERATION_IN_PROGRESS"  # retryable: it cancels nothing
    tools.HOLD.open()
    results = await task
    assert sorted(str(code(r)) for r in results) == ["None", str(ErrorCode.OPERATION_IN_PROGRESS)]
    assert tools.HELD_STARTED.value == started + 1


async def test_the_same_key_twice_in_turn_replays_and_a_reused_key_is_refused(serve: Any) -> None:
    served = await serve()
    tools.HOLD.open()
    done = tools.HELD_DONE.value
    first, again, other = await served.batch(*[call_request("held_note", {"text": "x"}, idempotency_key="k")] * 2,
                                             call_request("held_note", {"text": "y"}, idempotency_key="k"),
                                             max_concurrency=1)
    assert (first.data, first.meta.idempotency_replayed) == ({"count": done + 1}, False)
    assert (again.data, again.meta.idempotency_replayed) == ({"count": done + 1}, True)
    assert code(other) is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert tools.HELD_DONE.value == done + 1


# --- bounds -------------------------------------------------------------------------------------------------------


async def _status(address: str, request: pb.ExecuteToolBatchRequest) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.ToolServiceStub(channel).ExecuteToolBatch(request, timeout=10)
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.parametrize(("calls", "details"), [
    ([], EMPTY_BATCH),
    ([{"tool": "echo"}] * 4, "a batch holds at most 3 calls (limits.max_batch_calls), this one has 4"),
    ([{"tool": "echo"}, {"tool": ""}], "calls[1]: tool is required"),
], ids=["empty", "too many calls", "a call without its tool"])
async def test_a_malformed_batch_is_invalid_argument_and_runs_nothing(serve: Any, calls: list[dict[str, str]],
                                                                      details: str) -> None:
    served = await serve(max_batch_calls=3)
    request = pb.ExecuteToolBatchRequest(calls=[pb.ExecuteToolRequest(**call) for call in calls])
    assert await _status(served.address, request) == (grpc.StatusCode.INVALID_ARGUMENT, details)
    with pytest.raises(ClientError) as caught:
        await served.client.execute_batch([])
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, EMPTY_BATCH)
    assert await served.events() == []
    assert len(await served.client.execute_batch([call_request("echo", {"text": "x"})] * 3)) == 3  # at the bound


async def test_undecodable_batch_bytes_are_invalid_argument(serve: Any) -> None:
    served = await serve()
    async with grpc.aio.insecure_channel(served.address) as channel:
        raw = channel.unary_unary("/toolbooth.v1.ToolService/ExecuteToolBatch")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(b"\x0a\x05\xff\xfe\xfd\xfc\xfb", timeout=10)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, UNDECODABLE_DETAILS)


def _by_request(events: list[AuditEvent]) -> dict[str, list[tuple[str, str | None]]]:
    found: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for event in events:
        found[event.request_id].append((event.status, event.error_code))
    return found
