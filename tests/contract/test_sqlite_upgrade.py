"""SQLite files written before versioned migrations open with the new store: upgraded in place, every
record kept, the audit chain still verifying, and new writes working (``unversioned_sqlite``)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.contract import OperationState, PreviewState
from sidecar.state import DEADLINE_GRACE_SECONDS, AuditEvent, Claim, KeyScope, PreviewRecord
from sidecar.state.chain import verify_store
from sidecar.state.migrate import migrations
from sidecar.state.sqlite import SqliteStore
from sidecar.state.sqlite.legacy import UNVERSIONED_VERSION
from tests.contract import unversioned_sqlite as old
from tests.contract.test_store_contract import event

DONE = KeyScope("acme", "dev-1", "create_note", "done")
RUNNING = KeyScope("acme", "dev-1", "create_note", "running")
LOST = KeyScope("acme", "dev-1", "create_note", "lost")
SUCCESS = '{"status": "success", "data": {"id": 7}}'
MASK_KEY = b"old-mask-key-0123456789"


def preview(preview_id: str, **fields: object) -> PreviewRecord:
    values: dict[str, object] = {
        "preview_id": preview_id, "preview_hash": "sha256:" + "b" * 64, "tenant": "acme", "principal_id": "dev-1",
        "tool": "send_email", "tool_version": "1.0.0", "call_json": '{"tool":"send_email"}',
        "policy_revision": "sha256:rev", "reason": "irreversible", "approver_roles": ("approver",),
        "created_at": 1000.0, "expires_at": time.time() + 900, **fields}
    return PreviewRecord(**values)  # type: ignore[arg-type]


PREVIEWS = [preview("p-pending"), preview("p-approved", state=PreviewState.APPROVED, decided_by='{"id": "a"}',
                                          decided_at=1001.0, comment="ok")]


def fill(path: Path, stage: str) -> list[AuditEvent]:
    """A file of release ``stage`` holding records of every kind it had; the events written."""
    db = old.create(path, stage)
    with_arguments = "arguments_json" in old.columns(db, "audit")
    events = [event(n, arguments_json='{"title":"t"}' if with_arguments else None) for n in range(1, 6)]
    old.insert_operation(db, astuple_of(DONE), "hash-a", "r-done", SUCCESS, created_at=1000.0, deadline_at=1060.0)
    old.insert_operation(db, astuple_of(RUNNING), "hash-a", "r-running", None, created_at=time.time(),
                         deadline_at=time.time() + 60)
    old.insert_operation(db, astuple_of(LOST), "hash-a", "r-lost", None, created_at=1000.0,
                         deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
    old.insert_events(db, events[:3])
    old.insert_events(db, events[3:])
    if "previews" in old.tables(db):
        for record in PREVIEWS:
            old.insert_preview(db, record)
    if "audit_mask_key" in old.tables(db):
        db.execute("INSERT INTO audit_mask_key (id, key) VALUES (1, ?)", (MASK_KEY.hex(),))
    db.close()
    return events


def astuple_of(scope: KeyScope) -> tuple[str, str, str, str]:
    return (scope.tenant, scope.principal_id, scope.tool, scope.key)


@pytest.mark.parametrize("stage", list(old.STAGES))
async def test_an_unversioned_file_is_upgraded_keeping_every_record(tmp_path: Path, stage: str) -> None:
    path = tmp_path / "store.db"
    events = fill(path, stage)
    store = await SqliteStore.open(path)
    try:
        # idempotency records, as operations and as claims
        done, running, lost = [await store.operation(scope) for scope in (DONE, RUNNING, LOST)]
        assert done is not None and (done.request_id, done.result_json, done.created_at) == ("r-done", SUCCESS, 1000.0)
        assert done.state is OperationState.COMPLETED
        assert running is not None and running.state is OperationState.IN_PROGRESS
        assert lost is not None and lost.request_id == "r-lost"
        assert lost.state is (OperationState.UNKNOWN if "deadline" == stage else OperationState.IN_PROGRESS)
        replay = await store.claim(DONE, "hash-a", "r-again")
        assert replay.record is not None and not replay.reused and replay.record.result_json == SUCCESS
        assert (await store.claim(DONE, "hash-b", "r-other")).reused
        # audit events, their chain, the mask key
        assert await store.audit_events() == events
        report = await verify_store(store)
        chained = stage not in ("first", "masked-arguments")
        assert report.broken is None and (report.checked, report.unchained) == ((5, 0) if chained else (0, 5))
        kept = await store.audit_mask_key(b"new-mask-key-0123456789")
        assert kept == (MASK_KEY if chained else b"new-mask-key-0123456789")
        # previews
        had_previews = stage in ("previews", "deadline")
        for record in PREVIEWS:
            assert await store.get_preview(record.preview_id) == (record if had_previews else None)
        # new writes of every kind
        fresh = replace(DONE, key="fresh")
        assert await store.claim(fresh, "hash-a", "r-fresh", deadline_at=time.time() + 60) == Claim()
        await store.complete(fresh, SUCCESS, request_id="r-fresh")
        assert (await store.operation(fresh)).state is OperationState.COMPLETED  # type: ignore[union-attr]
        assert await store.save_preview(preview("p-new"), max_pending=100)
        assert await store.decide_preview("p-new", PreviewState.APPROVED, decided_by="{}", comment=None, now=1.0)
        assert await store.consume_approval("p-new", now=2.0, key="fresh")
        await store.record_audit(event(6))
        store.queue_audit(event(7, decision_ids='{"availability": "d-7"}', decision_input='{"time": "t"}'))
        await store.flush_audit()
        report = await verify_store(store)
        assert report.broken is None and report.checked == (7 if chained else 2)
    finally:
        await store.aclose()
    with sqlite3.connect(path) as db:
        versions = db.execute("SELECT version, name FROM toolbooth_schema ORDER BY version").fetchall()
    assert versions == [(m.version, m.name) for m in migrations("sqlite")]


async def test_an_upgraded_file_reopens_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    events = fill(path, "chain")
    for _ in range(2):
        store = await SqliteStore.open(path)
        try:
            assert await store.audit_events() == events
            assert (await verify_store(store)).checked == 5
        finally:
            await store.aclose()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM toolbooth_schema").fetchone() == (len(migrations("sqlite")),)


async def test_the_upgrade_gives_the_schema_a_new_file_has(tmp_path: Path) -> None:
    fill(tmp_path / "old.db", "first")
    for path in (tmp_path / "old.db", tmp_path / "new.db"):
        await (await SqliteStore.open(path)).aclose()
    shapes = []
    for path in (tmp_path / "old.db", tmp_path / "new.db"):
        with sqlite3.connect(path) as db:
            shapes.append({table: sorted(old.columns(db, table)) for table in old.tables(db)}
                          | {"indexes": db.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                                   "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()})
    assert shapes[0] == shapes[1]
    assert UNVERSIONED_VERSION <= len(migrations("sqlite"))
