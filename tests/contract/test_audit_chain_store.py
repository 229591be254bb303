"""The audit-chain part of the ``Store`` contract, on SQLite and on PostgreSQL (fixtures of
``test_store_contract``): the chain links every event, tampering breaks it where it happened, two stores
sharing one database append to one chain, and the mask key is created once."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from sidecar.state.chain import GENESIS_HASH, ChainBreak, verify_store
from sidecar.state.heads import extend
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import AnyStore, Stores, event

stores, store = contract.stores, contract.store  # the contract suite's fixtures: every backend
KEY = b"k" * 32


async def chain_of(store: AnyStore, count: int) -> list[int]:
    """Write ``count`` events, recorded and queued; return their ids."""
    for n in range(count):
        if n % 2:
            store.queue_audit(event(n))
        else:
            await store.flush_audit()
            await store.record_audit(event(n))
    await store.flush_audit()
    return [record.id for record in await store.audit_records()]


async def test_intact_chain_verifies(store: AnyStore) -> None:
    assert (await verify_store(store)).checked == 0
    ids = await chain_of(store, 7)
    records = await store.audit_records()
    assert records[0].prev_hash == GENESIS_HASH
    assert [r.prev_hash for r in records[1:]] == [r.hash for r in records[:-1]]
    report = await verify_store(store, page=3)
    assert (report.checked, report.broken, report.last_hash) == (len(ids), None, records[-1].hash)


async def test_changed_event_breaks_the_chain(stores: Stores, store: AnyStore) -> None:
    ids = await chain_of(store, 5)
    stores.backend.execute("UPDATE audit SET status = 'success', error_code = NULL, duration_ms = 1 WHERE id = %s",
                           (ids[2],))
    broken = (await verify_store(store)).broken
    assert broken is not None and broken.id == ids[2] and "changed" in broken.problem


async def test_removed_event_breaks_the_chain(stores: Stores, store: AnyStore) -> None:
    ids = await chain_of(store, 5)
    stores.backend.execute("DELETE FROM audit WHERE id = %s", (ids[1],))
    broken = (await verify_store(store)).broken
    assert broken is not None and broken.id == ids[2] and "removed" in broken.problem


async def test_reordered_events_break_the_chain(stores: Stores, store: AnyStore) -> None:
    ids = await chain_of(store, 5)
    columns = "request_id, time, input_hash, duration_ms, prev_hash, hash"
    first, second = (stores.backend.execute(f"SELECT {columns} FROM audit WHERE id = %s", (i,))[0] for i in ids[1:3])
    for target, values in ((ids[1], second), (ids[2], first)):  # swap the two events' contents
        stores.backend.execute(f"UPDATE audit SET ({columns}) = (%s, %s, %s, %s, %s, %s) WHERE id = %s",
                               (*values, target))
    broken = (await verify_store(store)).broken
    assert broken is not None and broken.id == ids[1] and "reordered" in broken.problem


async def test_concurrent_batches_of_two_stores_form_one_chain(stores: Stores, store: AnyStore) -> None:
    second = await stores.open()  # another sidecar on the same database

    async def write(s: AnyStore, name: str) -> None:
        for n in range(40):
            s.queue_audit(event(n, request_id=f"{name}-{n}"))
            if n % 8 == 7:
                await s.record_audit(event(n, request_id=f"{name}-{n}-recorded"))
            await asyncio.sleep(0)
        await s.flush_audit()

    await asyncio.gather(write(store, "a"), write(second, "b"))
    report = await verify_store(store)
    assert (report.checked, report.broken) == (2 * 45, None)


async def test_the_mask_key_is_created_once_and_kept(stores: Stores, store: AnyStore) -> None:
    assert await store.audit_mask_key(b"first-key-0123456789") == b"first-key-0123456789"
    second = await stores.open()
    assert await second.audit_mask_key(b"second-key-0123456789") == b"first-key-0123456789"


async def test_a_keyed_chain_verifies_with_its_key_and_names_its_head(store: AnyStore) -> None:
    assert await extend(store, KEY, None) == []
    store.use_chain_key(KEY)
    ids = await chain_of(store, 5)
    [head] = await extend(store, KEY, None, page=2)
    records = await store.audit_records()
    chain = records[0].chain
    assert (head.id, head.hash, head.count, head.chain) == (ids[-1], records[-1].hash, 5, chain)
    assert all((r.hash or "").startswith("hmac-sha256:") for r in records)
    report = await verify_store(store, key=KEY, marks={chain: 3}, page=2)
    assert (report.checked, report.broken, report.marks) == (5, None, {chain: records[2].hash})


async def test_heads_extended_from_earlier_heads_count_as_a_full_walk_does(stores: Stores, store: AnyStore) -> None:
    """A checkpoint checks only the links since the last one; the count it reaches is the full count, for every
    chain."""
    store.use_chain_key(KEY)
    await chain_of(store, 4)
    earlier = await extend(store, KEY, None)
    other = await stores.open()  # a second chain (PostgreSQL), or more of the one chain (SQLite)
    other.use_chain_key(KEY)
    await chain_of(other, 3)
    await chain_of(store, 2)
    onward = await extend(store, KEY, earlier)
    assert onward == await extend(store, KEY, None)
    assert isinstance(onward, list) and sum(head.count for head in onward) == 9


async def test_an_earlier_head_the_log_does_not_hold_is_a_break(store: AnyStore) -> None:
    store.use_chain_key(KEY)
    await chain_of(store, 3)
    [head] = await extend(store, KEY, None)
    for gone in (replace(head, id=head.id + 100, count=head.count + 100), replace(head, hash=GENESIS_HASH)):
        broken = await extend(store, KEY, [gone])
        assert isinstance(broken, ChainBreak) and "no longer in the log" in broken.problem, broken
