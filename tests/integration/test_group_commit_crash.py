"""Group commit loses nothing a caller was told: a sidecar killed (SIGKILL) in the middle of a burst of keyed
writes, each call with its own key, whose claims, dispatching events and completions share transactions.

After the kill, read from the SQLite file itself: every handler that ran (its line in the executions log)
has its claim and its dispatching event stored (audit before dispatch, exactly once); every call answered
SUCCESS has its result stored under its key; the chain verifies. After a restart, every key retried once
more runs at most once in all: a key whose handler ran replays or stays unknown, one that never ran runs now.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, Status, ToolResult
from tests.support.history import with_meters
from tests.support.sidecar_process import SidecarProcess, appended
from tests.support.waiting import until

pytestmark = pytest.mark.integration

WORKERS = 16
ANSWERED_BEFORE_KILL = 48  # the kill comes once this many calls were answered: more are claimed and running


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[[str], SidecarProcess]]:
    """``start(name)``: a sidecar process in dev mode on the test's one SQLite store, stopped at teardown."""
    started: list[SidecarProcess] = []
    unmetered = with_meters(tmp_path / "policies")

    def begin(name: str) -> SidecarProcess:
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"server": {"listen": [f"unix://{tmp_path / f'{name}.sock'}"]},
                                      "policy": {"path": str(unmetered)},  # a burst, not a limit's refusals
                                      "store": {"sqlite_path": str(tmp_path / "store.db")}}))
        sidecar = SidecarProcess(config, tmp_path / f"{name}.sock", tmp_path / f"{name}.err",
                                 tmp_path / "executions.log", deadline_grace=0.5)
        started.append(sidecar)
        return sidecar

    yield begin
    for sidecar in started:
        print(f"--- sidecar pid {sidecar.process.pid} exited with {sidecar.stop()}:\n{sidecar.output()}")


async def burst(sidecar: SidecarProcess, answered: dict[str, ToolResult], keys: list[str]) -> None:
    """``WORKERS`` callers, each looping over calls with new keys until the sidecar dies."""
    async with AsyncClient(sidecar.target, timeout=10) as client:

        async def worker(n: int) -> None:
            for i in range(10_000):
                key = f"k-{n}-{i}"
                keys.append(key)
                try:
                    answered[key] = await client.execute("append_line", {"text": key}, idempotency_key=key)
                except Exception:  # noqa: BLE001 - the channel breaks in one of several ways when the sidecar dies
                    return

        await asyncio.gather(*(worker(n) for n in range(WORKERS)))


def stored(db: Path) -> tuple[dict[str, str | None], Counter[tuple[str, str]]]:
    """From the file itself: each key's stored result (``None``: claimed, no result), and the audit events by
    (key, status)."""
    with sqlite3.connect(db) as conn:
        records = dict(conn.execute("SELECT key, result_json FROM idempotency").fetchall())
        events = Counter(conn.execute("SELECT idempotency_key, status FROM audit").fetchall())
    return records, events


async def test_a_kill_mid_burst_loses_no_acknowledged_write_and_runs_none_twice(
        start: Callable[[str], SidecarProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, db = tmp_path / "executions.log", tmp_path / "store.db"
    first = start("first")
    await first.wait_serving()
    answered: dict[str, ToolResult] = {}
    keys: list[str] = []
    calls = asyncio.create_task(burst(first, answered, keys))
    await until(lambda: len(answered) >= ANSWERED_BEFORE_KILL, timeout=60, what="answered calls")
    first.process.kill()
    first.process.wait(timeout=10)
    await calls

    ran = Counter(line.split(" ", 1)[1] for line in appended(log))
    records, events = stored(db)
    assert ran and max(ran.values()) == 1, ran.most_common(3)
    for key in ran:  # dispatched only once its claim and its dispatching event were committed
        assert key in records, f"{key} ran without a stored claim"
        assert events[(key, "dispatching")] == 1, f"{key} ran without its dispatching event"
    succeeded = [key for key, result in answered.items() if result.status is Status.SUCCESS]
    assert len(succeeded) == len(answered) >= ANSWERED_BEFORE_KILL, [r.error for r in answered.values()]
    for key in succeeded:  # answered only once its result was committed
        assert records[key] is not None and json.loads(records[key])["status"] == "success", key
    assert len(keys) > len(answered), "the kill came after every started call had finished"
    assert await asyncio.to_thread(main, ["audit", "verify", "--config", str(tmp_path / "first.json")]) == 0, (
        capsys.readouterr())

    second = start("second")
    await second.wait_serving()
    async with AsyncClient(second.target, timeout=10) as client:
        retries = await asyncio.gather(*(client.execute("append_line", {"text": key}, idempotency_key=key)
                                         for key in keys))
    after = Counter(line.split(" ", 1)[1] for line in appended(log))
    assert max(after.values()) == 1, after.most_common(3)
    for key, retry in zip(keys, retries, strict=True):
        if key in ran:  # ran before the kill: replayed, or unknown (never run again)
            assert (retry.status is Status.SUCCESS and retry.meta.idempotency_replayed) or (
                retry.error is not None and retry.error.code is ErrorCode.OPERATION_IN_PROGRESS), (key, retry)
        elif retry.status is Status.SUCCESS and not retry.meta.idempotency_replayed:
            assert after[key] == 1, key  # never ran before: runs now, once
        else:  # claimed, never dispatched: unknown, not run
            assert retry.error is not None and retry.error.code is ErrorCode.OPERATION_IN_PROGRESS, (key, retry)
            assert key not in after, key
    assert await asyncio.to_thread(main, ["audit", "verify", "--config", str(tmp_path / "second.json")]) == 0, (
        capsys.readouterr())
