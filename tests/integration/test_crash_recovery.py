"""A sidecar killed (SIGKILL) during a write handler: after a restart the call is unknown, never run again
automatically, until an operator resolves it; then retries replay the resolution."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, OperationState, Recovery, Status, ToolResult
from tests.support.sidecar_process import SidecarProcess, appended

pytestmark = pytest.mark.integration

GRACE = 0.5  # the child's DEADLINE_GRACE_SECONDS
CALL = {"text": "charge card"}


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[[str], SidecarProcess]]:
    """``start(name)``: a sidecar process in dev mode on the test's one SQLite store, stopped at teardown."""
    started: list[SidecarProcess] = []

    def begin(name: str) -> SidecarProcess:
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"server": {"listen": [f"unix://{tmp_path / f'{name}.sock'}"]},
                                      "store": {"sqlite_path": str(tmp_path / "store.db")}}))
        sidecar = SidecarProcess(config, tmp_path / f"{name}.sock", tmp_path / f"{name}.err",
                                 tmp_path / "executions.log", deadline_grace=GRACE)
        started.append(sidecar)
        return sidecar

    yield begin
    for sidecar in started:
        print(f"--- sidecar pid {sidecar.process.pid} exited with {sidecar.stop()}:\n{sidecar.output()}")


async def call(sidecar: SidecarProcess) -> ToolResult:
    async with AsyncClient(sidecar.target, timeout=10) as client:
        return await client.execute("append_then_wait", CALL, idempotency_key="charge-1")


async def operation_state(sidecar: SidecarProcess) -> OperationState:
    async with AsyncClient(sidecar.target, timeout=10) as client:
        return (await client.get_operation("append_then_wait", "charge-1")).state


async def wait_for_line(log: Path) -> float:
    """When the handler's effect (its line) appeared."""
    deadline = time.monotonic() + 10
    while not appended(log):
        assert time.monotonic() < deadline, "the handler never ran"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def test_a_write_interrupted_by_a_crash_is_unknown_until_resolved(start, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "executions.log"
    first = start("first")
    await first.wait_serving()
    running = asyncio.create_task(call(first))
    effect_at = await wait_for_line(log)
    first.process.kill()  # SIGKILL, mid-handler: the effect happened, its result was never stored
    first.process.wait(timeout=10)
    with pytest.raises(Exception):  # noqa: B017 - the channel breaks in one of several ways
        await running

    second = start("second")
    await second.wait_serving()
    await asyncio.sleep(max(0.0, effect_at + 1 + GRACE + 0.2 - time.monotonic()))  # past deadline + grace
    retry = await call(second)
    assert retry.error is not None and retry.error.code is ErrorCode.OPERATION_IN_PROGRESS
    assert retry.error.recovery is Recovery.CHECK_OPERATION_STATUS and "unknown" in retry.error.message
    assert await operation_state(second) is OperationState.UNKNOWN
    assert len(appended(log)) == 1  # never run again

    resolve = ["operations", "resolve", "charge-1", "--tool", "append_then_wait", "--principal", "dev",
               "--tenant", "dev", "--completed", "--note", "the card was charged",
               "--config", str(tmp_path / "second.json")]
    code = await asyncio.to_thread(main, resolve)  # asyncio.run of its own, in a thread
    assert code == 0, capsys.readouterr()
    replay = await call(second)
    assert replay.status is Status.SUCCESS and replay.meta.idempotency_replayed
    assert replay.data == {"resolved_by_operator": True, "note": "the card was charged"}
    assert await operation_state(second) is OperationState.COMPLETED
    assert len(appended(log)) == 1
