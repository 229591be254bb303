"""The ``Store`` contract, run against every backend: SQLite and PostgreSQL.

A second store opened by ``backend.open()`` shares the first one's database, as a
second sidecar process would: claims must be atomic across them too.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sidecar.config.store import StoreKind
from sidecar.contract import OperationState
from sidecar.errors import StoreUnavailableError
from sidecar.state import DEADLINE_GRACE_SECONDS, AuditEvent, Claim, KeyScope
from sidecar.state.postgres import PostgresStore
from sidecar.state.sqlite import SqliteStore
from tests.support.postgres import closed_port_dsn

AnyStore = SqliteStore | PostgresStore
SCOPE = KeyScope("acme", "dev-1", "create_note", "key-1")
IN_PROGRESS, UNKNOWN, REUSED = ("in_progress", None), ("unknown", None), ("reused", None)
SUCCESS = '{"status": "success", "data": {"count": 1}}'  # stored results: their status decides the state
ERROR = '{"status": "error", "data": {"resolved": 1}}'


def found(claim: Claim) -> tuple[str, str | None]:
    """What a claim found: ``claimed``, ``reused``, or the holding record's state and stored result."""
    if claim.claimed:
        return ("claimed", None)
    assert claim.record is not None
    return ("reused", None) if claim.reused else (claim.record.state.value, claim.record.result_json)


def replayed(result_json: str, state: OperationState = OperationState.COMPLETED) -> tuple[str, str | None]:
    return (state.value, result_json)


class SqliteBackend:
    """Stores on one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def open(self, *, lock_timeout_ms: int = 5000) -> SqliteStore:
        return await SqliteStore.open(self.path, busy_timeout_ms=lock_timeout_ms)

    async def open_unreachable(self) -> SqliteStore:
        """A store whose file cannot be created: its directory would be a regular file."""
        blocker = self.path.parent / "not-a-directory"
        blocker.write_text("")
        return await SqliteStore.open(blocker / "store.db")

    def execute(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``query`` (``%s`` placeholders) on a connection of its own, as someone with database access."""
        with sqlite3.connect(self.path, isolation_level=None) as other:
            return other.execute(query.replace("%s", "?"), params).fetchall()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Another connection holds the write lock."""
        other = sqlite3.connect(self.path, isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            yield
        finally:
            other.close()


class PostgresBackend:
    """Stores on one PostgreSQL schema, each with a pool of its own."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def open(self, *, lock_timeout_ms: int = 5000) -> PostgresStore:
        return await PostgresStore.open(self.dsn, lock_timeout_ms=lock_timeout_ms, connect_timeout=2)

    async def open_unreachable(self) -> PostgresStore:
        return await PostgresStore.open(closed_port_dsn(self.dsn), connect_timeout=2)

    def execute(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``query`` on a connection of its own, as someone with database access."""
        with psycopg.connect(self.dsn, autocommit=True) as other:
            cursor = other.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Another connection holds an exclusive lock on both tables."""
        with psycopg.connect(self.dsn) as other:
            other.execute("LOCK TABLE idempotency, audit IN ACCESS EXCLUSIVE MODE")
            yield
            other.rollback()


Backend = SqliteBackend | PostgresBackend


class Stores:
    """Opens stores on one backend; closes the ones still open at teardown."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._open: list[AnyStore] = []

    async def open(self, **options: Any) -> AnyStore:
        store = await self.backend.open(**options)
        self._open.append(store)
        return store

    async def close(self, store: AnyStore) -> None:
        self._open.remove(store)
        await store.aclose()

    async def close_all(self) -> None:
        for store in list(self._open):
            await self.close(store)


# Every store kind's backend for these tests: a new kind in sidecar.state.backends runs the contract once it has
# a row here (the fixture is parametrized over every kind, so a kind without one fails rather than being skipped).
BACKENDS: dict[StoreKind, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    StoreKind.SQLITE: lambda request, tmp_path: SqliteBackend(tmp_path / "store.db"),
    StoreKind.POSTGRES: lambda request, tmp_path: PostgresBackend(request.getfixturevalue("postgres_dsn")),
}


@pytest.fixture(params=list(StoreKind), ids=str)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    stores = Stores(BACKENDS[request.param](request, tmp_path))
    yield stores
    await stores.close_all()


@pytest.fixture
async def store(stores: Stores) -> AnyStore:
    return await stores.open()


def event(n: int, **fields: Any) -> AuditEvent:
    return AuditEvent(**{
        "request_id": f"req-{n}", "time": f"2026-01-01T00:00:{n:02d}.000+00:00", "principal_id": "dev-1",
        "tenant": "acme", "tool": "create_note", "tool_version": "1.0.0", "input_hash": f"sha256:{n:064x}",
        "decisions_json": '{"authz": {"allow": true}}', "policy_revision": "sha256:rev", "idempotency_key": None,
        "call_id": None, "conversation_id": "c-1", "status": "success", "error_code": None, "duration_ms": n,
        **fields})


# --- idempotency ------------------------------------------------------------------------------


async def test_claim_in_progress_reused_replay(store: AnyStore) -> None:
    assert await store.claim(SCOPE, "hash-a", "r1") == Claim()
    assert found(await store.claim(SCOPE, "hash-a", "r2")) == IN_PROGRESS
    reused = await store.claim(SCOPE, "hash-b", "r3")
    assert found(reused) == REUSED and reused.record is not None and reused.record.request_id == "r1"
    assert reused.record.state is OperationState.IN_PROGRESS and reused.record.scope == SCOPE
    await store.complete(SCOPE, SUCCESS, request_id="r1")
    assert found(await store.claim(SCOPE, "hash-a", "r4")) == replayed(SUCCESS)
    assert found(await store.claim(SCOPE, "hash-b", "r5")) == REUSED


async def test_a_record_held_for_the_legacy_hash_is_the_same_request(store: AnyStore) -> None:
    assert await store.claim(SCOPE, "legacy-a", "r1") == Claim()  # as a sidecar before RFC 8785 hashed it
    await store.complete(SCOPE, SUCCESS, request_id="r1")
    assert found(await store.claim(SCOPE, "jcs-a", "r2", legacy_hash="legacy-a")) == replayed(SUCCESS)
    assert found(await store.claim(SCOPE, "jcs-b", "r3", legacy_hash="legacy-b")) == REUSED
    assert found(await store.claim(SCOPE, "jcs-a", "r4")) == REUSED


async def test_a_stored_result_is_completed_on_success_else_failed(store: AnyStore) -> None:
    """A partial success is completed too: its effects are done, its errors name the parts that failed."""
    results = {"success": SUCCESS, "partial": '{"status": "partial_success"}', "error": ERROR,
               "approval": '{"status": "approval_required"}', "no-status": '{"count": 1}', "not-json": "[1"}
    for key, result in results.items():
        await store.claim(replace(SCOPE, key=key), "hash-a", f"r-{key}")
        await store.complete(replace(SCOPE, key=key), result, request_id=f"r-{key}")
    states = {key: (await store.claim(replace(SCOPE, key=key), "hash-a", "r")).record for key in results}
    assert {key: record.state if record else None for key, record in states.items()} == {
        "success": OperationState.COMPLETED, "partial": OperationState.COMPLETED,
        **{key: OperationState.FAILED for key in list(results)[2:]}}


async def test_in_progress_past_its_deadline_is_unknown(stores: Stores, store: AnyStore) -> None:
    lapsed = time.time() - DEADLINE_GRACE_SECONDS - 1
    await store.claim(SCOPE, "hash-a", "r1", deadline_at=lapsed)
    second = await stores.open()  # the sidecar restarted after the first one died
    assert found(await second.claim(SCOPE, "hash-a", "r2")) == UNKNOWN
    assert found(await second.claim(SCOPE, "hash-b", "r3")) == REUSED
    await store.complete(SCOPE, ERROR, request_id="r1")
    assert found(await second.claim(SCOPE, "hash-a", "r4")) == replayed(ERROR, OperationState.FAILED)


async def test_in_progress_within_deadline_and_grace_is_in_progress(store: AnyStore) -> None:
    other = replace(SCOPE, key="key-2")
    await store.claim(SCOPE, "hash-a", "r1", deadline_at=time.time() + 60)
    await store.claim(other, "hash-a", "r2", deadline_at=time.time() - DEADLINE_GRACE_SECONDS + 30)
    assert found(await store.claim(SCOPE, "hash-a", "r3")) == IN_PROGRESS
    assert found(await store.claim(other, "hash-a", "r4")) == IN_PROGRESS


async def test_operations_by_key_and_by_request(store: AnyStore) -> None:
    other = replace(SCOPE, key="key-2")
    await store.claim(SCOPE, "hash-a", "r1", deadline_at=time.time() + 60)
    await store.claim(other, "hash-a", "r2", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
    first = await store.operation(SCOPE)
    assert first is not None and first.state is OperationState.IN_PROGRESS and first.request_id == "r1"
    assert abs(first.created_at - time.time()) < 60 and first.scope == SCOPE
    lost = await store.operation_of_request("acme", "dev-1", "r2")
    assert lost is not None and lost.state is OperationState.UNKNOWN and lost.scope == other
    assert await store.operation_of_request("acme", "dev-2", "r2") is None
    assert await store.operation(replace(SCOPE, key="none")) is None
    assert [op.request_id for op in await store.pending_operations()] == ["r1", "r2"]
    await store.complete(SCOPE, SUCCESS, request_id="r1")
    done = await store.operation(SCOPE)
    assert done is not None and done.state is OperationState.COMPLETED and done.result_json == SUCCESS
    assert [op.request_id for op in await store.pending_operations()] == ["r2"]


async def test_resolve_settles_only_records_without_a_result(store: AnyStore) -> None:
    await store.claim(SCOPE, "hash-a", "r1", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
    assert await store.resolve_operation(SCOPE, ERROR, now=time.time())
    assert not await store.resolve_operation(SCOPE, SUCCESS, now=time.time())
    assert not await store.resolve_operation(replace(SCOPE, key="none"), "{}", now=time.time())
    assert found(await store.claim(SCOPE, "hash-a", "r2")) == replayed(ERROR, OperationState.FAILED)


async def test_a_late_outcome_never_replaces_an_operators_resolution(store: AnyStore) -> None:
    await store.claim(SCOPE, "hash-a", "r1", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
    assert await store.resolve_operation(SCOPE, ERROR, now=time.time())
    await store.complete(SCOPE, SUCCESS, request_id="r1")  # the crashed call's sidecar comes back after all
    await store.release(SCOPE, request_id="r1")
    assert found(await store.claim(SCOPE, "hash-a", "r2")) == replayed(ERROR, OperationState.FAILED)


async def test_expiry_deletes_only_old_completed_records(store: AnyStore) -> None:
    old, new, running = (replace(SCOPE, key=k) for k in ("old", "new", "running"))
    for n, scope in enumerate((old, new, running)):
        await store.claim(scope, "hash-a", f"r{n}", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
    await store.resolve_operation(old, "{}", now=time.time() - 3600)
    await store.complete(new, "{}", request_id="r1")
    assert await store.expire_operations(time.time() - 60) == 1
    assert await store.operation(old) is None
    assert await store.operation(new) is not None and await store.operation(running) is not None
    assert await store.expire_operations(time.time() + 60) == 1
    assert await store.operation(running) is not None


async def test_an_old_sqlite_file_gains_the_deadline_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE idempotency (tenant TEXT NOT NULL, principal_id TEXT NOT NULL, tool TEXT NOT NULL, "
                    "key TEXT NOT NULL, request_hash TEXT NOT NULL, request_id TEXT NOT NULL, result_json TEXT, "
                    "created_at REAL NOT NULL, completed_at REAL, PRIMARY KEY (tenant, principal_id, tool, key))")
        old.execute("INSERT INTO idempotency VALUES ('acme', 'dev-1', 'create_note', 'key-1', 'hash-a', 'r0', NULL, "
                    "0, NULL)")
    store = await SqliteStore.open(path)
    try:
        assert found(await store.claim(SCOPE, "hash-a", "r1")) == IN_PROGRESS  # no deadline: never unknown
        other = replace(SCOPE, key="key-2")
        await store.claim(other, "hash-a", "r2", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
        assert found(await store.claim(other, "hash-a", "r3")) == UNKNOWN
    finally:
        await store.aclose()


async def test_release_frees_the_key(store: AnyStore) -> None:
    await store.claim(SCOPE, "hash-a", "r1")
    await store.release(SCOPE, request_id="r1")
    assert await store.claim(SCOPE, "hash-b", "r2") == Claim()
    assert found(await store.claim(SCOPE, "hash-b", "r3")) == IN_PROGRESS


@pytest.mark.parametrize("other", [replace(SCOPE, tenant="globex"), replace(SCOPE, principal_id="dev-2"),
                                   replace(SCOPE, tool="send_email"), replace(SCOPE, key="key-2")],
                         ids=["tenant", "principal", "tool", "key"])
async def test_keys_are_scoped(store: AnyStore, other: KeyScope) -> None:
    await store.claim(SCOPE, "hash-a", "r1")
    assert await store.claim(other, "hash-b", "r2") == Claim()
    await store.complete(other, "{}", request_id="r2")
    assert found(await store.claim(SCOPE, "hash-a", "r3")) == IN_PROGRESS


async def test_concurrent_claims_have_one_winner(stores: Stores, store: AnyStore) -> None:
    second = await stores.open()  # another sidecar on the same database
    claims = await asyncio.gather(*(s.claim(SCOPE, "hash-a", f"r{i}") for i, s in enumerate([store, second] * 32)))
    assert Counter(found(c)[0] for c in claims) == {"claimed": 1, "in_progress": 63}


async def test_concurrent_claims_of_many_keys(stores: Stores, store: AnyStore) -> None:
    second = await stores.open()
    scopes = [replace(SCOPE, key=f"key-{n}") for n in range(8)]
    claims = await asyncio.gather(*(s.claim(scope, "hash-a", "r") for scope in scopes for s in (store, second) * 4))
    won = [c.claimed for c in claims]
    assert [sum(won[n * 8:(n + 1) * 8]) for n in range(8)] == [1] * 8


async def test_completed_key_replays_in_another_store(stores: Stores, store: AnyStore) -> None:
    await store.claim(SCOPE, "hash-a", "r1")
    await store.complete(SCOPE, SUCCESS, request_id="r1")
    second = await stores.open()
    assert found(await second.claim(SCOPE, "hash-a", "r2")) == replayed(SUCCESS)


async def test_key_released_by_one_store_is_claimed_by_another(stores: Stores, store: AnyStore) -> None:
    second = await stores.open()
    await store.claim(SCOPE, "hash-a", "r1")
    assert found(await second.claim(SCOPE, "hash-a", "r2")) == IN_PROGRESS
    await store.release(SCOPE, request_id="r1")
    assert await second.claim(SCOPE, "hash-a", "r3") == Claim()


async def test_claims_racing_releases_never_share_a_key(stores: Stores, store: AnyStore) -> None:
    second = await stores.open()
    holders: list[str] = []

    async def churn(name: str, s: AnyStore) -> None:
        for n in range(40):
            if (await s.claim(SCOPE, "hash-a", f"{name}-{n}")).claimed:
                assert holders == [], f"{name} claimed a key {holders} still held"
                holders.append(name)
                await asyncio.sleep(0)
                holders.remove(name)
                await s.release(SCOPE, request_id=f"{name}-{n}")

    await asyncio.gather(*(churn(f"{n}", s) for n, s in enumerate([store, second] * 3)))


# --- audit ------------------------------------------------------------------------------------


async def test_audit_keeps_order(store: AnyStore) -> None:
    events = [event(n) for n in range(30)]
    await store.record_audit(events[0])
    for e in events[1:15]:
        store.queue_audit(e)
    await store.flush_audit()
    await store.record_audit(events[15])
    for e in events[16:]:
        store.queue_audit(e)
    assert await store.audit_events() == events


async def test_audit_fields_round_trip(store: AnyStore) -> None:
    full = event(1, idempotency_key="k", call_id="m-1", error_code="TIMEOUT", status="error")
    await store.record_audit(full)
    await store.record_audit(event(2, conversation_id=None))
    assert await store.audit_events() == [full, event(2, conversation_id=None)]


async def test_flushed_events_are_seen_by_another_store(stores: Stores, store: AnyStore) -> None:
    for n in range(5):
        store.queue_audit(event(n))
    await store.flush_audit()
    second = await stores.open()
    assert [e.request_id for e in await second.audit_events()] == [f"req-{n}" for n in range(5)]


async def test_aclose_writes_queued_events(stores: Stores) -> None:
    first = await stores.open()
    first.queue_audit(event(1))
    await stores.close(first)
    second = await stores.open()
    assert await second.audit_events() == [event(1)]


# --- failures ---------------------------------------------------------------------------------


async def test_unreachable_store_is_unavailable(stores: Stores) -> None:
    with pytest.raises(StoreUnavailableError, match="cannot open"):
        await stores.backend.open_unreachable()


async def test_locked_store_is_unavailable_until_unlocked(stores: Stores, caplog: pytest.LogCaptureFixture) -> None:
    store = await stores.open(lock_timeout_ms=50)
    with stores.backend.locked():
        with pytest.raises(StoreUnavailableError):
            await store.claim(SCOPE, "hash-a", "r1")
        with pytest.raises(StoreUnavailableError):
            await store.record_audit(event(1))
        store.queue_audit(event(2))
        await store.flush_audit()  # a queued event that cannot be written is logged, not raised
    assert "1 audit event(s) could not be written" in caplog.text
    assert await store.claim(SCOPE, "hash-a", "r3") == Claim()
    await store.record_audit(event(3))
    assert await store.audit_events() == [event(3)]
