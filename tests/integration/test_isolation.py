"""Process isolation of sync handlers through a real sidecar (issue 8, defect 11).

The tools of ``tests.support.isolated`` run in the worker processes of their plugin (a registry
built from tools names a plugin by the tools' module). A runaway handler is stopped at its
deadline: the caller gets ``TIMEOUT`` within the deadline plus a bound, that worker's process is
gone (its pid, reported by the handler, no longer exists) and another serves the next call; other
calls in the pool go on. A handler that ends its worker (``os._exit``, a signal) or raises
``SystemExit`` gets ``INTERNAL_ERROR`` and the sidecar serves on. A write killed at its deadline is
unknown and never runs again. Shutdown, and the death of the sidecar itself, leave no worker behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from sidecar.bootstrap import open_pipeline, serve
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.contract import ErrorCode, OperationState, Recovery, Status, ToolResult
from sidecar.errors import PluginLoadError
from sidecar.plugin import Plugin
from sidecar.tools.isolation.process import Worker
from sidecar.tools.registry import Registry
from tests.support import isolated
from tests.support.sidecar_process import SidecarProcess
from tests.support.waiting import until

pytestmark = pytest.mark.integration

PLUGIN = "tests.support.isolated"
GRACE = 0.5  # isolation.stop_grace_seconds: SIGTERM, then SIGKILL this much later
BOUND = 3.0  # seconds a TIMEOUT may come after the deadline: the grace, the kill and a loaded machine
WAIT = 20.0  # seconds: the deadline of every wait for an event


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has: only its exit status is left)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def workers() -> set[int]:
    """This test process's worker processes (children of the sidecars it runs), whatever their state."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if any("sidecar.tools.isolation.worker" in part for part in child.cmdline()):
                found.add(child.pid)
    return found


@dataclass
class Served:
    """A sidecar serving the isolated tools, its client, and the directory the handlers leave traces in."""

    client: AsyncClient
    folder: Path

    def job(self, name: str) -> dict[str, str]:
        return {"dir": str(self.folder), "name": name}

    async def call(self, tool: str, name: str | None = None, **options: Any) -> ToolResult:
        return await self.client.execute(tool, self.job(name or tool), **options)

    async def pid_of(self, name: str) -> int:
        """The pid the handler of job ``name`` ran in, once it runs."""
        marker = self.folder / f"{name}.pid"
        await until(marker.exists, timeout=WAIT, what=f"job {name!r} starting")
        return int(marker.read_text())

    def runs(self, name: str) -> list[str]:
        path = self.folder / f"{name}.runs"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def serving(make_settings: Callable[..., Settings], socket_path: Path,
            tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Served]]:
    """``async with serving(**isolation) as served``: ``serve`` with the isolated tools, ``isolation`` naming
    their plugin (and ``isolation``'s other keys); it stops when the block ends."""

    @contextlib.asynccontextmanager
    async def run(**isolation: Any) -> AsyncIterator[Served]:
        settings = make_settings(server={"listen": [f"unix://{socket_path}"]},
                                 isolation={"plugins": [PLUGIN], **isolation})
        stop = asyncio.Event()
        tools = Plugin(isolated.ALL, settings=isolated.JobSettings).configure("isolated", {"label": "configured"})
        task = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools), stop=stop))
        try:
            await until(lambda: task.done() or socket_path.exists(), timeout=WAIT, what="the sidecar listening")
            if task.done():
                task.result()  # start-up failed: its error
            folder = tmp_path / "jobs"
            folder.mkdir(exist_ok=True)
            async with AsyncClient(f"unix://{socket_path}", timeout=WAIT) as client:
                yield Served(client, folder)
        finally:
            stop.set()
            await task

    return run


def timed_out_within(result: ToolResult, took: float) -> None:
    assert result.status is Status.ERROR and result.error is not None, result
    assert result.error.code is ErrorCode.TIMEOUT, result
    assert took < isolated.TIMEOUT + BOUND, f"TIMEOUT after {took:.2f} s"


async def timed(served: Served, tool: str, name: str, **options: Any) -> tuple[ToolResult, float]:
    began = time.monotonic()
    result = await served.call(tool, name, **options)
    return result, time.monotonic() - began


async def test_a_handler_runs_in_a_worker_with_its_context_and_its_log(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]],
        caplog: pytest.LogCaptureFixture) -> None:
    async with serving(workers_per_plugin=1) as served:
        with caplog.at_level(logging.WARNING, logger="toolbooth.tool.whoami"):
            result = await served.call("whoami", conversation_id="conv-7")
    assert result.status is Status.SUCCESS, result
    pid = result.data["pid"]
    assert pid in {record.process for record in caplog.records}  # the worker's own record, logged by the sidecar
    assert result.data == {"pid": pid, "principal": "dev", "tenant": "dev", "request_id": result.meta.request_id,
                           "idempotency_key": None, "attempt": 1, "remaining": result.data["remaining"],
                           "conversation_id": "conv-7", "label": "configured"}  # the plugin's settings too
    assert 0 < result.data["remaining"] <= 5  # whoami's timeout: the deadline crossed into the worker
    logged = next(r for r in caplog.records if r.name == "toolbooth.tool.whoami")
    assert logged.getMessage() == f"whoami ran in process {pid}" and logged.request_id == result.meta.request_id


@pytest.mark.parametrize("tool", ["spin", "spin_stubborn"])
async def test_a_runaway_sync_handler_is_stopped_at_its_deadline(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]], tool: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """``spin_stubborn`` ignores SIGTERM: it is killed ``stop_grace_seconds`` later."""
    async with serving(workers_per_plugin=1, stop_grace_seconds=GRACE) as served:
        first = (await served.call("whoami", "before")).data["pid"]
        with caplog.at_level(logging.WARNING, logger="toolbooth.isolation"):
            result, took = await timed(served, tool, "runaway")
        timed_out_within(result, took)
        pid = await served.pid_of("runaway")
        assert pid == first and gone(pid)  # the one worker ran it, and it was gone before the caller heard
        signal_name = "SIGKILL" if tool == "spin_stubborn" else "SIGTERM"
        assert any(f"worker process {pid} stopped, its call was interrupted" in r.getMessage()
                   and f"killed by {signal_name}" in r.getMessage() for r in caplog.records)
        if tool == "spin_stubborn":
            assert took >= isolated.TIMEOUT + GRACE
        after = await served.call("whoami", "after")
        assert after.status is Status.SUCCESS and after.data["pid"] != pid, after
        assert served.runs("runaway") == [str(pid)]


@pytest.mark.parametrize(("tool", "logged"), [("exit_now", "exit code 3"), ("crash", "killed by SIGSEGV"),
                                              ("raise_exit", "it raised SystemExit")])
async def test_a_handler_that_exits_or_kills_its_worker_gets_internal_error_and_the_sidecar_serves_on(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]], tool: str, logged: str,
        caplog: pytest.LogCaptureFixture) -> None:
    async with serving(workers_per_plugin=1) as served:
        with caplog.at_level(logging.WARNING):
            result = await served.call(tool)
        assert result.status is Status.ERROR and result.error is not None, result
        assert result.error.code is ErrorCode.INTERNAL_ERROR and result.error.message == "the tool failed unexpectedly"
        assert "Traceback" not in result.model_dump_json()
        assert any(logged in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        pid = await served.pid_of(tool)
        after = await served.call("whoami", "after")
        assert after.status is Status.SUCCESS, after
        if tool == "raise_exit":  # caught in the worker, which serves on
            assert after.data["pid"] == pid
        else:
            assert gone(pid) and after.data["pid"] != pid


@pytest.mark.parametrize(("tool", "logged"), [("exit_note", "exit code 1"), ("crash_note", "killed by SIGSEGV")])
async def test_a_write_whose_worker_dies_after_its_effect_is_unknown_and_never_runs_again(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]], tool: str, logged: str,
        caplog: pytest.LogCaptureFixture) -> None:
    async with serving(workers_per_plugin=1) as served:
        with caplog.at_level(logging.WARNING):
            result = await served.call(tool, "note", idempotency_key="k-1")
        assert result.status is Status.ERROR and result.error is not None, result
        assert (result.error.code, result.error.retryable) == (ErrorCode.INTERNAL_ERROR, False), result
        assert result.error.recovery is Recovery.CHECK_OPERATION_STATUS, result  # not do_not_retry: it may have run
        assert "Traceback" not in result.model_dump_json()
        assert any(logged in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        pid = await served.pid_of("note")
        assert (await served.client.get_operation(tool, "k-1")).state is OperationState.UNKNOWN
        retry = await served.call(tool, "note", idempotency_key="k-1")
        assert retry.error is not None and retry.error.code is ErrorCode.OPERATION_IN_PROGRESS, retry
        assert retry.error.recovery is Recovery.CHECK_OPERATION_STATUS and "unknown" in retry.error.message
        assert (await served.call("whoami")).status is Status.SUCCESS  # the replacement worker serves
        assert (await served.client.get_operation(tool, "k-1")).state is OperationState.UNKNOWN
        assert served.runs("note") == [str(pid)]  # its effect happened once; nothing ran it again


async def test_a_write_whose_worker_had_ended_before_the_call_reached_it_ran_nothing(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker the call leased dies before the request is written: nothing ran, the key is released."""
    ask = Worker.call
    killed: list[int] = []

    async def call_a_dead_worker(worker: Worker, tool: str, args: Any, ctx: Any) -> Any:
        if not killed:  # the first call only
            killed.append(worker.pid)
            psutil.Process(worker.pid).kill()
            await until(lambda: not worker.alive, timeout=WAIT, what="the worker's end noticed")
        return await ask(worker, tool, args, ctx)

    monkeypatch.setattr(Worker, "call", call_a_dead_worker)
    async with serving(workers_per_plugin=1) as served:
        result = await served.call("exit_note", "lost", idempotency_key="k-4")
        assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE, result
        assert result.error.message == "the tool's worker process ended before the call reached it; nothing ran"
        assert result.error.retryable and result.error.recovery is Recovery.RETRY_WITH_BACKOFF, result
        assert served.runs("lost") == [] and killed
        assert (await served.client.get_operation("exit_note", "k-4")).state is OperationState.NOT_FOUND
        retry = await served.call("exit_note", "lost", idempotency_key="k-4")  # the key was released: it runs
        assert retry.error is not None and retry.error.recovery is Recovery.CHECK_OPERATION_STATUS, retry
        assert served.runs("lost") == [str(await served.pid_of("lost"))] != [str(killed[0])]


async def test_an_idle_worker_that_dies_is_replaced(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]],
        caplog: pytest.LogCaptureFixture) -> None:
    async with serving(workers_per_plugin=1) as served:
        pid = (await served.call("whoami")).data["pid"]
        with caplog.at_level(logging.WARNING, logger="toolbooth.isolation"):
            psutil.Process(pid).kill()  # as the OOM killer would
            await until(lambda: any(f"worker process {pid} stopped, it ended by itself (killed by SIGKILL); "
                                    "starting another" in r.getMessage() for r in caplog.records),
                        timeout=WAIT, what="the sidecar noticing")
        after = await served.call("whoami")
        assert after.status is Status.SUCCESS and after.data["pid"] != pid, after


@pytest.mark.parametrize(("tool", "code", "message"), [
    ("refuse", ErrorCode.RESOURCE_NOT_FOUND, "no job named 'refuse'"),
    ("wrong_output", ErrorCode.INTERNAL_ERROR, "the tool returned an invalid result"),
    ("unpicklable", ErrorCode.INTERNAL_ERROR, "the tool failed unexpectedly"),
])
async def test_a_handlers_errors_cross_from_its_worker_as_from_a_thread(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]], tool: str, code: ErrorCode,
        message: str) -> None:
    async with serving(workers_per_plugin=1) as served:
        before = (await served.call("whoami")).data["pid"]
        result = await served.call(tool)
        assert result.error is not None and (result.error.code, result.error.message) == (code, message), result
        if tool == "refuse":
            assert result.error.field == "name" and not result.error.retryable
            assert result.error.details == {"known_jobs": ["job"]}
        assert (await served.call("whoami")).data["pid"] == before  # the worker is still the same


async def test_a_partial_result_crosses_from_its_worker(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]]) -> None:
    async with serving(workers_per_plugin=1) as served:
        result = await served.call("partly")
    assert result.status is Status.PARTIAL_SUCCESS and result.data is not None, result
    assert result.data["pid"] != os.getpid()
    [failed] = result.errors
    assert (failed.code, failed.message, failed.details) == (ErrorCode.PARTIAL_DELIVERY, "one part failed", {"part": 2})


async def test_concurrent_isolated_calls_go_on_while_one_is_stopped(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]]) -> None:
    async with serving(workers_per_plugin=3) as served:
        held = [asyncio.create_task(served.call("gated", name)) for name in ("held-1", "held-2")]
        pids = [await served.pid_of(name) for name in ("held-1", "held-2")]
        result, took = await timed(served, "spin", "runaway")
        timed_out_within(result, took)
        runaway = await served.pid_of("runaway")
        assert gone(runaway) and runaway not in pids
        assert not any(map(gone, pids)) and not any(task.done() for task in held)  # still running
        (served.folder / "gate").touch()
        results = await asyncio.gather(*held)
        assert [r.status for r in results] == [Status.SUCCESS, Status.SUCCESS], results
        assert [r.data["pid"] for r in results] == pids


async def test_a_write_killed_at_its_deadline_is_unknown_and_never_runs_again(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]]) -> None:
    async with serving(workers_per_plugin=1) as served:
        result, took = await timed(served, "spin_note", "note", idempotency_key="k-1")
        timed_out_within(result, took)
        assert result.error is not None and not result.error.retryable
        assert result.error.recovery is Recovery.CHECK_OPERATION_STATUS
        pid = await served.pid_of("note")
        assert gone(pid)
        assert (await served.client.get_operation("spin_note", "k-1")).state is OperationState.UNKNOWN
        retry = await served.call("spin_note", "note", idempotency_key="k-1")
        assert retry.error is not None and retry.error.code is ErrorCode.OPERATION_IN_PROGRESS, retry
        assert "unknown" in retry.error.message
        assert (await served.call("whoami")).status is Status.SUCCESS  # the replacement worker serves
        assert (await served.client.get_operation("spin_note", "k-1")).state is OperationState.UNKNOWN
        assert served.runs("note") == [str(pid)]  # its effect happened once; nothing ran it again


async def test_a_call_still_waiting_for_a_worker_at_its_deadline_never_ran(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]]) -> None:
    async with serving(workers_per_plugin=1) as served:
        held = asyncio.create_task(served.call("gated", "held"))
        await served.pid_of("held")  # the one worker is busy
        queued = await served.call("spin_note", "queued", idempotency_key="k-2")
        assert queued.error is not None and queued.error.code is ErrorCode.TIMEOUT and queued.meta.attempt == 0
        assert queued.error.message == "the call's deadline passed before the tool ran" and queued.error.retryable
        assert (await served.client.get_operation("spin_note", "k-2")).state is OperationState.NOT_FOUND
        assert served.runs("queued") == [] and not held.done()
        (served.folder / "gate").touch()
        assert (await held).status is Status.SUCCESS


async def test_a_write_still_waiting_for_a_worker_at_its_callers_deadline_never_runs(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]]) -> None:
    """Its own deadline (exit_note's timeout) is far ahead, but it never started by its caller's."""
    async with serving(workers_per_plugin=1) as served:
        held = asyncio.create_task(served.call("gated", "held"))
        await served.pid_of("held")  # the one worker is busy
        with pytest.raises(ClientError) as raised:
            await served.call("exit_note", "queued", idempotency_key="k-3", timeout=0.5)
        assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED, raised.value

        async def released() -> bool:
            return (await served.client.get_operation("exit_note", "k-3")).state is OperationState.NOT_FOUND

        await until(released, timeout=5.0, what="the queued write's key released")  # not at exit_note's 10 s
        (served.folder / "gate").touch()
        assert (await held).status is Status.SUCCESS
        assert (await served.call("whoami")).status is Status.SUCCESS  # after the queued write, were it waiting
        assert served.runs("queued") == []


async def test_shutdown_stops_every_worker_even_one_running_a_handler(
        serving: Callable[..., contextlib.AbstractAsyncContextManager[Served]], socket_path: Path) -> None:
    before = workers()
    async with AsyncClient(f"unix://{socket_path}", timeout=WAIT) as caller:  # outlives the sidecar
        async with serving(workers_per_plugin=2) as served:
            started = workers() - before
            assert len(started) == 2, started  # started with the sidecar, before any call
            held = asyncio.create_task(caller.execute("gated", served.job("held")))
            assert await served.pid_of("held") in started
            began = time.monotonic()
        took = time.monotonic() - began  # the server's grace (2 s) for the call in flight, then the workers' stop
        assert took < 2 + GRACE + BOUND, f"shutdown took {took:.2f} s"
        assert all(map(gone, started)) and not workers() - before
        with pytest.raises(ClientError):  # cancelled by the shutdown
            await held


VANISHING = """
from sidecar.plugin import SideEffect, ToolContext, tool
from tests.support.isolated import Job, Ran, ran

@tool(name="vanishing", version="1.0.0", side_effect=SideEffect.NONE)
def vanishing(args: Job, ctx: ToolContext) -> Ran:
    return ran(args, ctx)

TOOLS = [vanishing]
"""


@pytest.mark.parametrize(("since", "expected"), [
    ("removed", ("a worker process of plugin 'vanishing_plugin' cannot import its isolated handlers:\n",
                 "ModuleNotFoundError: No module named 'vanishing_plugin'")),
    ("exits", ("a worker process of plugin 'vanishing_plugin' ended before it was ready (exit code 5)", "")),
])
async def test_a_plugin_its_workers_cannot_import_stops_start_up(
        tmp_path: Path, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, since: str,
        expected: tuple[str, str]) -> None:
    """The sidecar imported the plugin, whose file has changed since: a fresh interpreter finds no module, or
    one that ends its process."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "vanishing_plugin.py").write_text(VANISHING)
    monkeypatch.syspath_prepend(str(source))
    module = importlib.import_module("vanishing_plugin")
    monkeypatch.setitem(sys.modules, "vanishing_plugin", module)  # forgotten after the test
    if since == "removed":
        shutil.rmtree(source)
    else:
        (source / "vanishing_plugin.py").write_text("import os\nos._exit(5)\n")
    before = workers()
    settings = make_settings(isolation={"plugins": ["vanishing_plugin"]})
    with pytest.raises(PluginLoadError) as info:
        await open_pipeline(settings, registry=Registry.from_tools(module.TOOLS))
    start, end = expected
    assert str(info.value).startswith(start) and str(info.value).endswith(end), info.value
    assert workers() == before


async def test_a_worker_ends_by_itself_when_the_sidecar_dies(tmp_path: Path) -> None:
    """SIGKILL to the sidecar leaves its worker running a handler (``gated``: 20 s) alone: it ends within a
    second or so, not at its handler's deadline."""
    socket = tmp_path / "tb.sock"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"server": {"listen": [f"unix://{socket}"]},
                                  "store": {"sqlite_path": str(tmp_path / "store.db")},
                                  "isolation": {"plugins": [PLUGIN], "workers_per_plugin": 1}}))
    sidecar = SidecarProcess(config, socket, tmp_path / "sidecar.err", tmp_path / "executions.log")
    try:
        await sidecar.wait_serving()
        served = Served(AsyncClient(sidecar.target, timeout=WAIT), tmp_path)
        held = asyncio.create_task(served.call("gated", "held"))
        pid = await served.pid_of("held")
        sidecar.process.send_signal(signal.SIGKILL)
        sidecar.process.wait(timeout=WAIT)
        await until(lambda: gone(pid), timeout=5, what=f"worker {pid} ending after its sidecar")
        with contextlib.suppress(Exception):  # the sidecar is gone: the call fails
            await held
        await served.client.close()
    finally:
        print(f"--- sidecar exited with {sidecar.stop()}:\n{sidecar.output()}")
