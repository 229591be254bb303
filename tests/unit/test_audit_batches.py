"""Queued audit events gather into batches: for ``linger`` seconds, until a batch is full, or until a flush."""

from __future__ import annotations

import asyncio

from sidecar.state.audit import BATCH_ROWS, AuditBatcher
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent
from tests.support.waiting import until

DEADLINE = 10.0  # seconds any of these may take on a loaded machine; the linger below is far longer


def _event(n: int) -> AuditEvent:
    return AuditEvent(f"r{n}", "t", "p", "acme", "echo", "1", "h", "{}", "rev", None, None, None, "success", None, 1)


class Writes:
    """The batches written, each as its request ids."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def __call__(self, rows: list[Row]) -> None:
        self.batches.append([str(row[0]) for row in rows])


async def test_events_queued_within_the_linger_share_one_write() -> None:
    writes = Writes()
    batcher = AuditBatcher(writes, linger=0.5)
    for n in range(5):
        batcher.put(_event(n))
        await asyncio.sleep(0)  # the drain task runs, and gathers
    assert writes.batches == []  # still gathering
    await until(lambda: bool(writes.batches), timeout=DEADLINE)
    assert writes.batches == [[f"r{n}" for n in range(5)]]


async def test_a_flush_writes_at_once_whatever_the_linger() -> None:
    writes = Writes()
    batcher = AuditBatcher(writes, linger=3600)
    batcher.put(_event(1))
    await asyncio.sleep(0)
    await asyncio.wait_for(batcher.flush(), DEADLINE)
    batcher.put(_event(2))  # a new batch gathers again
    await asyncio.sleep(0)
    assert writes.batches == [["r1"]] and batcher.depth == 1
    await asyncio.wait_for(batcher.flush(), DEADLINE)
    assert writes.batches == [["r1"], ["r2"]] and batcher.depth == 0


async def test_a_full_batch_is_written_without_waiting_out_the_linger() -> None:
    writes = Writes()
    batcher = AuditBatcher(writes, linger=3600)
    for n in range(BATCH_ROWS + 3):
        batcher.put(_event(n))
    await until(lambda: bool(writes.batches), timeout=DEADLINE)
    assert [len(batch) for batch in writes.batches] == [BATCH_ROWS + 3]


async def test_without_a_linger_the_drain_writes_at_once() -> None:
    writes = Writes()
    batcher = AuditBatcher(writes)
    batcher.put(_event(1))
    await until(lambda: bool(writes.batches), timeout=DEADLINE)
    assert writes.batches == [["r1"]]
