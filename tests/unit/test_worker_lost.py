"""A worker process that ends before it answers: ``WorkerLost`` says whether the call had reached it.

Only a call that never reached the worker (it had ended before the request was written) provably ran
nothing (``delivered`` false); once the request was written, the handler may have run, whatever ended
the process afterwards. Real worker processes, spawned as the pool spawns them.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.contract import Principal
from sidecar.tools.definition import ToolContext, ToolDefinition
from sidecar.tools.isolation.paths import handler_path
from sidecar.tools.isolation.process import Worker, WorkerLost
from tests.support import isolated
from tests.support.waiting import until

HANDLERS: list[ToolDefinition[isolated.Job, isolated.Ran]] = [isolated.whoami, isolated.exit_note]


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    started = await Worker.spawn("isolated", {defn.name: handler_path(defn) for defn in HANDLERS},
                                 on_end=lambda _: None, timeout=60)
    yield started
    await started.stop(0)


def context() -> ToolContext:
    logger = logging.LoggerAdapter(logging.getLogger("toolbooth.tool.test"), {})
    return ToolContext(principal=Principal(id="p"), request_id="r", deadline=time.monotonic() + 20,
                       idempotency_key="k", attempt=1, logger=logger)


async def test_a_call_to_a_worker_that_had_ended_ran_nothing(worker: Worker, tmp_path: Path) -> None:
    os.kill(worker.pid, signal.SIGKILL)
    await until(lambda: not worker.alive, timeout=20, what="the worker's end noticed")
    with pytest.raises(WorkerLost) as lost:
        await worker.call("whoami", isolated.Job(dir=str(tmp_path)), context())
    assert not lost.value.delivered
    assert not (tmp_path / "job.runs").exists()


async def test_a_worker_that_ends_after_the_call_reached_it_may_have_run_it(worker: Worker, tmp_path: Path) -> None:
    with pytest.raises(WorkerLost) as lost:
        await worker.call("exit_note", isolated.Job(dir=str(tmp_path)), context())
    assert lost.value.delivered
    assert (tmp_path / "job.runs").read_text() == f"{worker.pid}\n"  # it had its effect
