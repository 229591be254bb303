"""Group commit on a real SQLite store: concurrent writes share transactions, each answered after its commit;
a unit the chain refuses fails alone; a caller that goes away leaves its write standing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.state import KeyScope
from sidecar.state.chain import verify_store
from sidecar.state.sqlite import SqliteStore
from tests.contract.test_store_contract import event


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await SqliteStore.open(tmp_path / "store.db")
    yield opened
    await opened.aclose()


def scope(n: int) -> KeyScope:
    return KeyScope("acme", "dev-1", "create_note", f"k-{n}")


async def test_concurrent_claims_and_events_share_transactions(store: SqliteStore) -> None:
    before = store.group.batches
    claims = await asyncio.gather(*(store.claim(scope(n), "hash", f"r-{n}") for n in range(32)))
    await asyncio.gather(*(store.record_audit(event(n)) for n in range(32)))
    assert all(claim.claimed for claim in claims)
    assert store.group.batches - before < 64, store.group.batches  # 64 writes in fewer transactions
    for n in range(32):
        record = await store.operation(scope(n))
        assert record is not None and record.request_id == f"r-{n}"
    report = await verify_store(store)
    assert (report.checked, report.broken) == (32, None)


async def test_two_claims_of_one_key_in_one_batch_find_each_other(store: SqliteStore) -> None:
    first, second, other = await asyncio.gather(store.claim(scope(1), "hash", "r-1"),
                                                store.claim(scope(1), "hash", "r-2"),
                                                store.claim(scope(1), "other-hash", "r-3"))
    assert first.claimed and not second.claimed and not other.claimed
    assert second.record is not None and second.record.request_id == "r-1" and not second.reused
    assert other.reused


async def test_an_event_the_chain_refuses_fails_alone(store: SqliteStore) -> None:
    bad = event(3, duration_ms=float("nan"))  # canonical JSON has no NaN: the link cannot be hashed
    results = await asyncio.gather(*(store.record_audit(e) for e in (event(1), event(2), bad, event(4))),
                                   return_exceptions=True)
    assert [isinstance(r, Exception) for r in results] == [False, False, True, False], results
    assert [e.request_id for e in await store.audit_events()] == ["req-1", "req-2", "req-4"]
    assert (await verify_store(store)).broken is None


async def test_a_caller_that_goes_away_leaves_its_write_standing(store: SqliteStore) -> None:
    gone = asyncio.create_task(store.record_audit(event(1)))
    await asyncio.sleep(0)  # queued
    gone.cancel()
    await store.record_audit(event(2))  # queued after it: committed after it
    assert [e.request_id for e in await store.audit_events()] == ["req-1", "req-2"]
