"""A started write outlives its caller's gRPC deadline: it runs to its own timeout, is recorded, and a retry replays it.

The write (``tests.support.tools.sleepy_note``, an async handler: the kind a deadline used to cancel) takes
longer than its caller waits, on each RPC that carries a deadline: a batch, a stream and a unary call (there
``held_note``, held until its retry was answered). The caller gets ``DEADLINE_EXCEEDED``; its key ends
``completed`` without an operator, and the same call again replays the stored result (while the write still
runs, a retry gets ``OPERATION_IN_PROGRESS``). Shutdown (or serve failing)
still bounds it: a write running at the end of ``server.shutdown_grace_seconds`` is stopped there, its key
unknown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.bootstrap import open_pipeline, serve
from sidecar.client import AsyncClient, ClientError, call_request
from sidecar.config import Settings
from sidecar.contract import ErrorCode, OperationState, Recovery, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.state import AuditEvent
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.waiting import until

pytestmark = pytest.mark.integration

TOOL = "sleepy_note"
WAIT = 20.0  # seconds: the deadline of every wait for an event
BOUND = 3.0  # seconds a shutdown may take past its grace on a loaded machine


async def statuses(pipeline: Pipeline, key: str) -> list[str]:
    """The statuses of the audit events of the calls with ``key``, in order."""
    found: list[AuditEvent] = await pipeline.store.audit_events()  # type: ignore[attr-defined]
    return [event.status for event in found if event.idempotency_key == key]


@dataclass
class Served:
    pipeline: Pipeline
    client: AsyncClient

    async def events(self, key: str) -> list[str]:
        return await statuses(self.pipeline, key)

    async def settled(self, key: str, tool: str = TOOL) -> None:
        """Wait until the write of ``tool`` with ``key`` is no longer running, then check it is stored as
        completed (no operator does anything)."""
        states: list[OperationState] = []

        async def ended() -> bool:
            states.append((await self.client.get_operation(tool, key)).state)
            return states[-1] is not OperationState.IN_PROGRESS

        await until(ended, timeout=WAIT, what=f"the write {key!r} ending")
        assert states[-1] is OperationState.COMPLETED, states[-1]


@pytest.fixture
async def served(make_settings: Callable[..., Settings], start_sidecar: Any) -> AsyncIterator[Served]:
    settings = make_settings()
    pipeline = await open_pipeline(settings, registry=Registry.from_tools([*tools.ALL, *tools.BATCH_AND_STREAM]))
    sidecar = await start_sidecar(settings, pipeline)
    async with AsyncClient(sidecar.addresses[0], timeout=WAIT) as client:
        yield Served(pipeline, client)
    await pipeline.aclose()


def deadline_exceeded(raised: pytest.ExceptionInfo[ClientError]) -> None:
    assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED, raised.value


def replayed(result: ToolResult, number: int) -> None:
    assert result.status is Status.SUCCESS and result.meta.idempotency_replayed, result
    assert result.data == {"count": number}, result


async def test_a_batch_deadline_does_not_stop_its_started_writes(served: Served) -> None:
    before = tools.SLEPT.value
    calls = [call_request(TOOL, {"count": 1500}, idempotency_key=key) for key in ("b-1", "b-2")]
    with pytest.raises(ClientError) as raised:
        await served.client.execute_batch(calls, timeout=1.0)
    deadline_exceeded(raised)
    for key in ("b-1", "b-2"):
        await served.settled(key)
        assert await served.events(key) == ["dispatching", "success"]
    again = await served.client.execute_batch(calls)
    assert all(result.meta.idempotency_replayed for result in again), again
    assert sorted(result.data["count"] for result in again if result.data) == [before + 1, before + 2], again
    assert tools.SLEPT.value == before + 2  # each ran once


async def test_a_stream_deadline_does_not_stop_its_started_write(served: Served) -> None:
    before = tools.SLEPT.value
    with pytest.raises(ClientError) as raised:
        _ = [event async for event in served.client.execute_stream(TOOL, {"count": 1500}, idempotency_key="s-1",
                                                                     timeout=0.5)]
    deadline_exceeded(raised)
    await served.settled("s-1")
    events = [event async for event in served.client.execute_stream(TOOL, {"count": 1500}, idempotency_key="s-1")]
    assert len(events) == 1 and isinstance(events[0], ToolResult), events
    replayed(events[0], before + 1)
    assert tools.SLEPT.value == before + 1
    assert await served.events("s-1") == ["dispatching", "success", "success"]  # the write, then its replay


async def test_a_unary_deadline_does_not_stop_its_started_write(served: Served) -> None:
    """``held_note`` runs until the test opens ``HOLD``: its caller's deadline passes, and its retry is
    answered, while it surely runs (within its own timeout, 5 s)."""
    held, arguments = "held_note", {"text": "u"}
    before, started = tools.HELD_DONE.value, tools.HELD_STARTED.value
    tools.HOLD.close()
    try:
        call = asyncio.ensure_future(served.client.execute(held, arguments, idempotency_key="u-1", timeout=1.0))
        await tools.HELD_STARTED.reached(started + 1, timeout=WAIT)
        with pytest.raises(ClientError) as raised:
            await call
        deadline_exceeded(raised)
        running = await served.client.execute(held, arguments, idempotency_key="u-1")
    finally:
        tools.HOLD.open()
    assert running.error is not None and running.error.code is ErrorCode.OPERATION_IN_PROGRESS, running
    assert running.error.recovery is Recovery.CHECK_OPERATION_STATUS and "still running" in running.error.message
    await served.settled("u-1", held)
    replayed(await served.client.execute(held, arguments, idempotency_key="u-1"), before + 1)
    assert tools.HELD_DONE.value == before + 1 and tools.HELD_STARTED.value == started + 1


@pytest.mark.parametrize("ending", ["stop", "cancel"])  # a shutdown, or serve failing (its task cancelled)
async def test_shutdown_stops_a_started_write_at_the_end_of_its_grace(make_settings: Callable[..., Settings],
                                                                       socket_path: Path, ending: str) -> None:
    grace = 1.0
    settings = make_settings(server={"listen": [f"unix://{socket_path}"], "shutdown_grace_seconds": grace})
    registry = Registry.from_tools([*tools.ALL, *tools.BATCH_AND_STREAM])
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, registry=registry, stop=stop))
    await until(lambda: task.done() or socket_path.exists(), timeout=WAIT, what="the sidecar listening")
    async with AsyncClient(f"unix://{socket_path}", timeout=WAIT) as client:
        write = asyncio.ensure_future(client.execute(TOOL, {"count": 8000}, idempotency_key="g-1"))

        async def running() -> bool:
            return (await client.get_operation(TOOL, "g-1")).state is OperationState.IN_PROGRESS

        await until(running, timeout=WAIT, what="the write running")
        began = time.monotonic()
        if ending == "stop":
            stop.set()
            await task
        else:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        took = time.monotonic() - began
        with pytest.raises(ClientError):  # its RPC ended by the shutdown
            await write
    assert took < grace + BOUND, f"shutdown took {took:.2f} s; the write would have run 8 s"
    pipeline = await open_pipeline(settings, registry=registry)
    try:
        found = await pipeline.get_operation(settings.auth.dev_principal, tool=TOOL, key="g-1")
        assert found.state is OperationState.UNKNOWN, found
        assert await statuses(pipeline, "g-1") == ["dispatching", "error"]
    finally:
        await pipeline.aclose()
