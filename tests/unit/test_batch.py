"""``Pipeline.execute_batch`` in process: what a batch whose caller goes away leaves behind, and its bounds."""

from __future__ import annotations

import asyncio
import json

import pytest

from sidecar.config import Limits
from sidecar.contract import CallBatch, CallRequest, OperationState
from sidecar.errors import InvalidRequestError
from sidecar.pipeline.batch import concurrency
from sidecar.state import KeyScope
from sidecar.tools.registry import Registry
from tests.conftest import DEVELOPER, PipelineFactory
from tests.support import tools
from tests.support.waiting import until


def turn(name: str) -> CallRequest:
    return CallRequest(tool="turn", arguments_json=json.dumps({"name": name}))


async def test_a_batch_whose_caller_goes_away_cancels_its_reads_and_audits_every_call(
        make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, *tools.BATCH_AND_STREAM]))
    tools.TICKETS.reset()
    tools.HOLD.close()
    started, done = tools.HELD_STARTED.value, tools.HELD_DONE.value
    write = CallRequest(tool="held_note", arguments_json='{"text": "w"}', idempotency_key="w-1")
    batch = CallBatch(calls=(write, turn("a"), turn("b")), max_concurrency=2)
    task = asyncio.ensure_future(pipeline.execute_batch(DEVELOPER, batch))
    await tools.HELD_STARTED.reached(started + 1)
    await until(lambda: tools.TICKETS.started == ["a"], what="the read running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (tools.TICKETS.cancelled, tools.TICKETS.started) == (["a"], ["a"])  # b never started
    tools.HOLD.open()
    scope = KeyScope(DEVELOPER.tenant, DEVELOPER.id, "held_note", "w-1")

    async def stored() -> bool:
        record = await pipeline.store.operation(scope)
        return record is not None and record.state is OperationState.COMPLETED

    await until(stored, what="the started write recorded")
    assert tools.HELD_DONE.value == done + 1
    events = await pipeline.store.audit_events()  # type: ignore[attr-defined]
    assert sorted((e.tool, e.status) for e in events) == [("held_note", "dispatching"), ("held_note", "success"),
                                                          ("turn", "cancelled"), ("turn", "cancelled")]


@pytest.mark.parametrize(("calls", "message"), [
    (0, "a batch needs at least one call"),
    (3, "a batch holds at most 2 calls (limits.max_batch_calls), this one has 3"),
])
async def test_a_batch_out_of_bounds_is_refused_before_anything_runs(make_pipeline: PipelineFactory, calls: int,
                                                                      message: str) -> None:
    pipeline = await make_pipeline(max_batch_calls=2)
    batch = CallBatch(calls=(CallRequest(tool="echo", arguments_json='{"text": "x"}'),) * calls)
    with pytest.raises(InvalidRequestError) as caught:
        await pipeline.execute_batch(DEVELOPER, batch)
    assert str(caught.value) == message
    assert await pipeline.store.audit_events() == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(("asked", "expected"), [(0, 4), (1, 1), (4, 4), (5, 4), (1000, 4)])
def test_the_concurrency_asked_for_is_capped_by_the_configuration(asked: int, expected: int) -> None:
    batch = CallBatch(calls=(CallRequest(tool="echo"),), max_concurrency=asked)
    assert concurrency(batch, Limits(max_batch_concurrency=4)) == expected
