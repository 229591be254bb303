"""The preview part of the ``Store`` contract, on SQLite and on PostgreSQL (fixtures of
``test_store_contract``): decisions and consumption are atomic across two stores sharing one database."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from sidecar.contract import PreviewState
from sidecar.state import PreviewCursor, PreviewQuery, PreviewRecord
from sidecar.state.sqlite import SqliteStore
from sidecar.state.sqlite.driver import SQLITE
from sidecar.state.statements import StoreStatements
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import AnyStore, Stores

stores, store = contract.stores, contract.store  # the contract suite's fixtures: every backend
CAP = 1000  # pending previews a principal may hold, more than any test here saves


def preview(preview_id: str = "p-1", **fields: object) -> PreviewRecord:
    now = time.time()
    values: dict[str, object] = {
        "preview_id": preview_id, "preview_hash": "sha256:" + "a" * 64, "tenant": "acme", "principal_id": "dev-1",
        "tool": "send_email", "tool_version": "1.0.0", "call_json": '{"tool":"send_email"}',
        "policy_revision": "sha256:rev", "reason": "irreversible", "approver_roles": ("approver", "security"),
        "created_at": now, "expires_at": now + 900, **fields}
    return PreviewRecord(**values)  # type: ignore[arg-type]


async def test_saved_preview_reads_back_equal(store: AnyStore) -> None:
    saved = preview()
    await store.save_preview(saved, max_pending=CAP)
    assert await store.get_preview("p-1") == saved
    assert await store.get_preview("p-unknown") is None


async def test_approve_then_consume_once(store: AnyStore) -> None:
    await store.save_preview(preview(), max_pending=CAP)
    assert not await store.consume_approval("p-1", now=time.time())  # pending: nothing to consume
    assert await store.decide_preview("p-1", PreviewState.APPROVED, decided_by='{"id":"boss"}', comment="ok",
                                      now=123.5)
    approved = await store.get_preview("p-1")
    assert approved is not None and approved.state is PreviewState.APPROVED
    assert (approved.decided_by, approved.decided_at, approved.comment) == ('{"id":"boss"}', 123.5, "ok")
    assert await store.consume_approval("p-1", now=200.0, key="k-7")
    assert not await store.consume_approval("p-1", now=201.0, key="k-8")
    used = await store.get_preview("p-1")
    assert used is not None and used.state is PreviewState.USED and (used.used_at, used.used_key) == (200.0, "k-7")


async def test_a_used_approval_is_given_back_only_once_and_only_when_used(store: AnyStore) -> None:
    await store.save_preview(preview(), max_pending=CAP)
    assert not await store.restore_approval("p-1")  # pending: nothing to give back
    assert await store.decide_preview("p-1", PreviewState.APPROVED, decided_by="b", comment=None, now=1.0)
    assert not await store.restore_approval("p-1")  # approved, not used
    assert await store.consume_approval("p-1", now=2.0, key="k-1")
    assert await store.restore_approval("p-1")
    assert not await store.restore_approval("p-1")
    restored = await store.get_preview("p-1")
    assert restored is not None and (restored.state, restored.used_at, restored.used_key) == (
        PreviewState.APPROVED, None, None)
    assert restored.decided_by == "b"  # the approval itself is kept
    assert await store.consume_approval("p-1", now=3.0, key="k-2")
    assert not await store.restore_approval("nope")


async def test_a_decision_is_final(store: AnyStore) -> None:
    await store.save_preview(preview(), max_pending=CAP)
    assert await store.decide_preview("p-1", PreviewState.DENIED, decided_by="b", comment="no", now=1.0)
    assert not await store.decide_preview("p-1", PreviewState.APPROVED, decided_by="c", comment=None, now=2.0)
    assert not await store.consume_approval("p-1", now=3.0)
    denied = await store.get_preview("p-1")
    assert denied is not None and (denied.state, denied.decided_by, denied.comment) == (PreviewState.DENIED, "b", "no")


async def test_unknown_preview_cannot_be_decided_or_consumed(store: AnyStore) -> None:
    assert not await store.decide_preview("nope", PreviewState.APPROVED, decided_by="b", comment=None, now=1.0)
    assert not await store.consume_approval("nope", now=1.0)


async def test_previews_by_state_newest_first(store: AnyStore) -> None:
    for n in range(3):
        await store.save_preview(preview(f"p-{n}", created_at=100.0 + n), max_pending=CAP)
    await store.decide_preview("p-1", PreviewState.DENIED, decided_by="b", comment="no", now=1.0)
    assert [p.preview_id for p in await store.previews(PreviewQuery(PreviewState.PENDING, 100))] == ["p-2", "p-0"]
    assert [p.preview_id for p in await store.previews(PreviewQuery(PreviewState.PENDING, 1))] == ["p-2"]
    assert [p.preview_id for p in await store.previews(PreviewQuery(PreviewState.DENIED, 100))] == ["p-1"]


async def test_concurrent_decisions_and_consumptions_have_one_winner(stores: Stores, store: AnyStore) -> None:
    second = await stores.open()  # another sidecar on the same database
    await store.save_preview(preview(), max_pending=CAP)
    decided = await asyncio.gather(*(s.decide_preview("p-1", PreviewState.APPROVED, decided_by=f"b{i}", comment=None,
                                                      now=1.0) for i, s in enumerate([store, second] * 8)))
    assert Counter(decided) == {True: 1, False: 15}
    consumed = await asyncio.gather(*(s.consume_approval("p-1", now=2.0) for s in [store, second] * 16))
    assert Counter(consumed) == {True: 1, False: 31}


async def test_the_audit_of_approved_calls_is_read_since_a_time_newest_first(store: AnyStore) -> None:
    def step(n: int, trail: str) -> None:
        store.queue_audit(contract.event(n, decisions_json=trail))

    step(1, '{"approval_id": "p-1", "authz": {"allow": true}}')  # before ``since``
    step(2, '{"approval_id": "p-1", "authz": {"allow": true}}')
    step(3, '{"authz": {"allow": true}}')  # a call without an approval
    step(4, '{"approver": {"preview_id": "p-1"}}')  # an approver's decision, not a call sent with the approval
    step(5, '{"approval_id": "p-2", "authz": {"reason": "100%_sure"}}')
    step(6, '{"approval_id": "p-3"}')
    await store.flush_audit()
    found = await store.approval_audit("2026-01-01T00:00:02.000+00:00", limit=10)
    assert [r.event.request_id for r in found] == ["req-6", "req-5", "req-2"]
    assert [r.event.request_id for r in await store.approval_audit("2026-01-01T00:00:02.000+00:00", limit=2)] == [
        "req-6", "req-5"]
    assert await store.approval_audit("2026-01-01T00:01:00.000+00:00", limit=10) == []


async def test_a_listing_reads_one_tenant_within_its_bounds_after_a_cursor(store: AnyStore) -> None:
    now = time.time()
    for n, (tenant, created, expires) in enumerate([("acme", 10.0, now + 60), ("evil", 11.0, now + 60),
                                                   ("acme", 12.0, now - 1), ("acme", 12.0, now + 60),
                                                   ("acme", 12.0, now + 90), ("acme", 13.0, now + 60)]):
        await store.save_preview(preview(f"p-{n}", tenant=tenant, created_at=created, expires_at=expires),
                                 max_pending=CAP)
    pending = PreviewQuery(PreviewState.PENDING, 10, tenant="acme", expires_after=now)
    assert [p.preview_id for p in await store.previews(pending)] == ["p-5", "p-4", "p-3", "p-0"]
    after = replace(pending, after=PreviewCursor(12.0, "p-4"), limit=1)  # ties of created_at: by id, descending
    assert [p.preview_id for p in await store.previews(after)] == ["p-3"]
    assert [p.preview_id for p in await store.previews(replace(pending, tenant=None))] == ["p-5", "p-4", "p-3",
                                                                                          "p-1", "p-0"]
    expired = replace(pending, expires_after=now - 10, expires_by=now, created_after=11.0)
    assert [p.preview_id for p in await store.previews(expired)] == ["p-2"]


async def test_a_listing_reads_only_the_tool_and_requester_it_names(store: AnyStore) -> None:
    now = time.time()
    for n, (tenant, principal_id, tool) in enumerate([("acme", "dev-1", "file_note"), ("acme", "ops (eu)", "file_note"),
                                                     ("acme", "ops (eu)", "send_email"), ("evil", "ops (eu)", "x")]):
        await store.save_preview(preview(f"p-{n}", tenant=tenant, principal_id=principal_id, created_at=10.0 + n,
                                         tool=tool), max_pending=CAP)
    pending = PreviewQuery(PreviewState.PENDING, 10, tenant="acme", expires_after=now)
    assert [p.preview_id for p in await store.previews(replace(pending, tool="file_note"))] == ["p-1", "p-0"]
    assert [p.preview_id for p in await store.previews(replace(pending, principal_id="ops (eu)"))] == ["p-2", "p-1"]
    both = replace(pending, tool="send_email", principal_id="ops (eu)")
    assert [p.preview_id for p in await store.previews(both)] == ["p-2"]
    assert [p.preview_id for p in await store.previews(replace(pending, tenant=None, principal_id="ops (eu)"))] == [
        "p-3", "p-2", "p-1"]
    assert await store.previews(replace(pending, principal_id="ops")) == []


async def test_a_principal_holds_at_most_max_pending_unexpired_previews(store: AnyStore) -> None:
    now = time.time()
    await store.save_preview(preview("p-old", expires_at=now - 1), max_pending=CAP)  # expired: not counted
    saved = await asyncio.gather(*(store.save_preview(preview(f"p-{n}"), max_pending=3) for n in range(8)))
    assert Counter(saved) == {True: 3, False: 5}
    assert await store.save_preview(preview("p-other", principal_id="dev-2"), max_pending=3)
    assert await store.save_preview(preview("p-elsewhere", tenant="evil"), max_pending=3)
    kept = await store.previews(PreviewQuery(PreviewState.PENDING, 100, tenant="acme", expires_after=now))
    assert Counter(p.principal_id for p in kept) == {"dev-1": 3, "dev-2": 1}


async def test_listings_and_the_count_read_by_index(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "toolbooth.db")
    sql, cursor = StoreStatements.of(SQLITE), ("pending", None, None, 1.0, math.inf, 0.0, math.inf, "", 101)
    try:
        plans = [await store.driver.fetch(f"EXPLAIN QUERY PLAN {statement}", params) for statement, params in (
            (sql.list_tenant_previews, ("acme", *cursor)), (sql.list_previews, cursor),
            (sql.pending_of_principal, ("acme", "dev-1", 1.0)))]
    finally:
        await store.aclose()
    details = [" ".join(str(row[-1]) for row in plan) for plan in plans]
    for index, detail in zip(("previews_tenant_listing", "previews_state_listing", "previews_principal_pending"),
                             details, strict=True):
        assert f"INDEX {index} " in detail and "TEMP B-TREE" not in detail, detail
