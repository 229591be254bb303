"""Audit chains per store instance (migration 7): a version 6 log becomes chain 1 and still verifies, with its
version 1 checkpoint; on PostgreSQL store instances appending concurrently each keep a chain of their own,
linked after the newest event of the log when they started; tampering shows in each chain, in the links
between them and against a checkpoint of every chain's head."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest

from sidecar.state.chain import GENESIS_HASH, chained, verify_store
from sidecar.state.checkpoint import Checkpoint, Checkpointer, _signature, compare, read_checkpoint
from sidecar.state.migrate import migrate
from sidecar.state.postgres import PostgresStore
from sidecar.state.records import ChainHead
from sidecar.state.rows import CHAINED_COLUMNS, audit_row
from tests.contract import test_store_contract as contract
from tests.contract.test_migrations import driver_of
from tests.contract.test_store_contract import PostgresBackend, Stores, event

stores = contract.stores  # every backend
KEY = b"chain-key-of-thirty-two-bytes..."


async def test_a_version_6_log_becomes_chain_1_and_verifies_with_its_old_checkpoint(stores: Stores,
                                                                                    tmp_path: Path) -> None:
    async with driver_of(stores) as driver:
        assert await migrate(driver, target=6) == 6
    old = list(chained(None, [audit_row(event(n)) for n in range(1, 5)], KEY))  # as version 6 linked them
    names = ", ".join(CHAINED_COLUMNS)
    for row in old:
        stores.backend.execute(f"INSERT INTO audit ({names}) VALUES ({', '.join(['%s'] * len(row))})", row)
    [(head_id,)] = stores.backend.execute("SELECT max(id) FROM audit")
    v1 = Checkpoint((ChainHead(head_id, old[-1][-1], 4),), "2026-01-01T00:00:00.000+00:00")  # version 6's file
    path = tmp_path / "v1.checkpoint"
    path.write_text(json.dumps({"version": 1, "count": 4, "head_id": head_id, "head": old[-1][-1],
                                "written_at": v1.written_at, "signature": _signature(v1, KEY, 1)}))

    store = await stores.open()  # migrates to 7
    store.use_chain_key(KEY)
    await store.record_audit(event(5))
    records = await store.audit_records()
    assert [r.chain for r in records[:4]] == [1] * 4
    assert records[4].prev_hash == old[-1][-1]  # the first new link follows the old log
    checkpoint = read_checkpoint(path, KEY)
    report = await verify_store(store, key=KEY, marks=checkpoint.marks)
    assert (report.checked, report.broken) == (5, None)
    assert compare(report, checkpoint) is None
    stores.backend.execute("DELETE FROM audit WHERE id = %s", (head_id,))  # the old head, behind a new link
    broken = (await verify_store(store, key=KEY)).broken  # SQLite: chain 1 goes on; PostgreSQL: chain 2 starts
    assert broken is not None and broken.id in (head_id, records[4].id) and "removed" in broken.problem, broken


@pytest.fixture
def pg(postgres_dsn: str) -> PostgresBackend:
    return PostgresBackend(postgres_dsn)


async def chain_of(store: PostgresStore, tag: str, n: int) -> None:
    """``n`` events appended by ``store``, half written at once, half queued."""
    await asyncio.gather(*(store.record_audit(event(i, request_id=f"{tag}-{i}")) for i in range(n // 2)))
    for i in range(n // 2, n):
        store.queue_audit(event(i, request_id=f"{tag}-{i}"))
    await store.flush_audit()


async def two_chains(pg: PostgresBackend) -> tuple[PostgresStore, PostgresStore]:
    """Two store instances (as two sidecars) that appended 40 events each, at the same time."""
    a, b = await pg.open(), await pg.open()
    for store in (a, b):
        store.use_chain_key(KEY)
    await asyncio.gather(chain_of(a, "a", 40), chain_of(b, "b", 40))
    return a, b


async def test_concurrent_store_instances_each_append_to_a_chain_of_their_own(pg: PostgresBackend,
                                                                              tmp_path: Path) -> None:
    a, b = await two_chains(pg)
    try:
        records = await a.audit_records()
        chains = {tag: {r.chain for r in records if r.event.request_id.startswith(tag)} for tag in "ab"}
        assert len(chains["a"]) == len(chains["b"]) == 1 and chains["a"] != chains["b"], chains
        report = await verify_store(a, key=KEY, page=7)
        assert (report.checked, report.broken) == (80, None)
        assert report.counts == {chains["a"].pop(): 40, chains["b"].pop(): 40}
        starts = await a.audit_chains()
        assert starts[0].chain == 1 and len(starts) == 3  # chain 1 (of older events, none here), a's, b's
        first = next(r for r in records if r.chain == starts[1].chain)
        assert (starts[1].link_id, first.prev_hash) == (None, GENESIS_HASH)  # the first chain of an empty log
        written = await Checkpointer(a, KEY, tmp_path / "cp.json").write()
        assert written is not None and len(written.heads) == 2
        checkpoint = read_checkpoint(tmp_path / "cp.json", KEY)
        assert compare(await verify_store(b, key=KEY, marks=checkpoint.marks), checkpoint) is None
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_chain_started_later_links_after_the_newest_event(pg: PostgresBackend) -> None:
    a = await pg.open()
    b = await pg.open()
    try:
        await a.record_audit(event(1, request_id="a-1"))
        await b.record_audit(event(2, request_id="b-1"))
        first_a, first_b = await a.audit_records()
        assert first_b.prev_hash == first_a.hash and first_b.chain != first_a.chain
        pg.execute("DELETE FROM audit WHERE id = %s", (first_a.id,))  # a's chain is empty, still "valid"
        broken = (await verify_store(a)).broken
        assert broken is not None and broken.id == first_a.id and "which is missing" in broken.problem, broken
    finally:
        await a.aclose()
        await b.aclose()


async def test_tampering_shows_in_the_chain_it_touches(pg: PostgresBackend, tmp_path: Path) -> None:
    a, b = await two_chains(pg)
    try:
        checkpoint = await Checkpointer(a, KEY, tmp_path / "cp.json").write()
        assert checkpoint is not None
        records = await a.audit_records()
        b_chain = next(r.chain for r in records if r.event.request_id.startswith("b"))
        in_b = [r for r in records if r.chain == b_chain]

        pg.execute("UPDATE audit SET status = 'failed' WHERE id = %s", (in_b[10].id,))  # changed
        broken = (await verify_store(a, key=KEY)).broken
        assert broken is not None and broken.id == in_b[10].id and "do not match its hash" in broken.problem
        pg.execute("UPDATE audit SET status = %s WHERE id = %s", (in_b[10].event.status, in_b[10].id))

        pg.execute("DELETE FROM audit WHERE id = %s", (in_b[5].id,))  # removed mid-chain
        broken = (await verify_store(a, key=KEY)).broken
        assert broken is not None and broken.id == in_b[6].id and "was removed" in broken.problem, broken

        pg.execute("DELETE FROM audit WHERE chain_id = %s AND id >= %s", (b_chain, in_b[5].id))
        report = await verify_store(a, key=KEY, marks=checkpoint.marks)  # b's chain cut short: valid, shorter
        assert report.broken is None
        problem = compare(report, checkpoint)
        assert problem is not None and f"in chain {b_chain}" in problem and "the log holds 5" in problem

        pg.execute("DELETE FROM audit_chains WHERE id = %s", (b_chain,))  # its registration removed
        broken = (await verify_store(a, key=KEY)).broken
        assert broken is not None and broken.id == in_b[0].id and "not registered" in broken.problem

        pg.execute("DELETE FROM audit WHERE chain_id = %s", (b_chain,))  # the whole chain removed
        report = await verify_store(a, key=KEY, marks=checkpoint.marks)
        problem = compare(report, checkpoint)
        assert report.broken is None and problem is not None and "the log holds 0" in problem
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_checkpoint_names_every_chain_and_its_signature_covers_them(pg: PostgresBackend,
                                                                              tmp_path: Path) -> None:
    a, b = await two_chains(pg)
    try:
        path = tmp_path / "cp.json"
        await Checkpointer(b, KEY, path).write()
        data = json.loads(path.read_text())
        assert data["version"] == 2 and [c["count"] for c in data["chains"]] == [40, 40]
        data["chains"] = data["chains"][:1]  # hide a chain
        path.write_text(json.dumps(data))
        with pytest.raises(Exception, match="signature that fails"):
            read_checkpoint(path, KEY)
        data["chains"] = []
        path.write_text(json.dumps(data))
        with pytest.raises(Exception, match="malformed"):
            read_checkpoint(path, KEY)
    finally:
        await a.aclose()
        await b.aclose()


def test_a_checkpoint_written_now_reads_back_equal(tmp_path: Path) -> None:
    from sidecar.state.checkpoint import write_checkpoint

    heads = (ChainHead(9, "sha256:" + "a" * 64, 3, 1), ChainHead(12, "sha256:" + "b" * 64, 2, 4))
    checkpoint = Checkpoint(heads, dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"))
    write_checkpoint(tmp_path / "cp.json", checkpoint, KEY)
    assert read_checkpoint(tmp_path / "cp.json", KEY) == checkpoint
    assert (checkpoint.count, checkpoint.head_id, checkpoint.marks) == (5, 12, {1: 3, 4: 2})


async def test_a_batch_that_rolls_back_leaves_the_chain_linked_to_what_committed(stores: Stores) -> None:
    """A store keeps its chain's last hash between batches; after a batch that rolled back (an event in it the
    chain refuses) the next one links to what is stored, not to the rows that were never committed."""
    store = await stores.open()
    await store.record_audit(event(1))
    bad = event(3, duration_ms=float("nan"))  # canonical JSON has no NaN: its link cannot be hashed
    results = await asyncio.gather(*(store.record_audit(e) for e in (event(2), bad, event(4))),
                                   return_exceptions=True)
    assert [isinstance(r, Exception) for r in results] == [False, True, False], results
    await store.record_audit(event(5))
    assert [e.request_id for e in await store.audit_events()] == ["req-1", "req-2", "req-4", "req-5"]
    report = await verify_store(store)
    assert (report.checked, report.broken) == (4, None)
