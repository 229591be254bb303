"""What only the PostgreSQL store has: migrations, lost connections, a read-only server, the
DSN's password kept out of every message, and the whole pipeline over PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from sidecar import bootstrap
from sidecar.config import bundled_policy_dir, parse_settings
from sidecar.contract import CallRequest, ErrorCode, OperationState, Status
from sidecar.errors import StoreUnavailableError
from sidecar.pipeline import Pipeline
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.state import KeyScope
from sidecar.state.migrate import migrate, migrations
from sidecar.state.postgres import PostgresDriver, PostgresStore
from sidecar.tools.registry import Registry
from tests.conftest import ADMIN, DEVELOPER
from tests.support import tools
from tests.support.postgres import PASSWORD, PostgresServer, closed_port_dsn, with_options
from tests.support.waiting import until

SCOPE = KeyScope("acme", "dev-1", "create_note", "key-1")


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(postgres_dsn, min_size=1, max_size=1)
    yield store
    await store.aclose()


# --- migrations -------------------------------------------------------------------------------


def test_migrations_are_numbered_from_one() -> None:
    known = migrations("postgres")
    assert [m.version for m in known] == list(range(1, len(known) + 1))
    assert known[0].name == "0001_idempotency_and_audit"


async def test_concurrent_migrations_apply_each_version_once(postgres: PostgresServer, postgres_dsn: str) -> None:
    connections = [await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) for _ in range(6)]
    try:
        versions = await asyncio.gather(*(migrate(PostgresDriver(conn, "test")) for conn in connections))
    finally:
        for conn in connections:
            await conn.close()
    assert versions == [len(migrations("postgres"))] * 6
    rows = postgres.execute("SELECT version, name FROM toolbooth_schema ORDER BY version", dsn=postgres_dsn)
    assert rows == [(m.version, m.name) for m in migrations("postgres")]


async def test_reopening_keeps_the_data(postgres_dsn: str) -> None:
    first = await PostgresStore.open(postgres_dsn)
    await first.claim(SCOPE, "hash-a", "r1")
    await first.aclose()
    second = await PostgresStore.open(postgres_dsn)
    try:
        claim = await second.claim(SCOPE, "hash-a", "r2")
        assert claim.record is not None and not claim.reused and claim.record.state is OperationState.IN_PROGRESS
    finally:
        await second.aclose()


async def test_a_newer_schema_is_refused(postgres: PostgresServer, store: PostgresStore, postgres_dsn: str) -> None:
    # ``store`` migrated the schema; now a newer sidecar seems to have migrated it further
    postgres.execute("INSERT INTO toolbooth_schema (version, name) VALUES (999, '0999_future')", dsn=postgres_dsn)
    newest = len(migrations("postgres"))
    with pytest.raises(StoreUnavailableError, match=f"schema is at version 999, newer than this sidecar's {newest};"):
        await PostgresStore.open(postgres_dsn)


# --- failures ---------------------------------------------------------------------------------


async def test_closed_port_never_shows_the_password(postgres_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    dsn = closed_port_dsn(postgres_dsn)
    assert PASSWORD in dsn
    with pytest.raises(StoreUnavailableError) as info:
        await PostgresStore.open(dsn, connect_timeout=1)
    message = str(info.value)
    assert "Connection refused" in message and "postgresql://postgres@127.0.0.1:" in message
    assert PASSWORD not in message and PASSWORD not in caplog.text


async def test_killed_connection_is_unavailable_then_replaced(postgres: PostgresServer, store: PostgresStore,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    await store.claim(SCOPE, "hash-a", "r1")
    killed = postgres.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    assert killed and all(ok for (ok,) in killed)
    with pytest.raises(StoreUnavailableError, match="PostgreSQL store at postgresql://postgres@") as info:
        await store.operation(SCOPE)  # a read: not tried again
    assert PASSWORD not in str(info.value) and PASSWORD not in caplog.text
    claim = await store.claim(SCOPE, "hash-a", "r2")  # on a new connection
    assert claim.record is not None and claim.record.state is OperationState.IN_PROGRESS


async def test_read_only_server_is_unavailable(store: PostgresStore, postgres_dsn: str) -> None:
    # ``store`` migrated the schema: opening finds nothing to write
    read_only = await PostgresStore.open(with_options(postgres_dsn, "-c default_transaction_read_only=on"))
    try:
        with pytest.raises(StoreUnavailableError, match="ReadOnlySqlTransaction"):
            await read_only.claim(SCOPE, "hash-a", "r1")
    finally:
        await read_only.aclose()


async def test_pool_timeout_is_unavailable(postgres_dsn: str) -> None:
    # the claim waits for the lock as long as the test needs (a loaded machine), holding the only connection
    store = await PostgresStore.open(postgres_dsn, min_size=1, max_size=1, connect_timeout=0.2,
                                     lock_timeout_ms=60_000, statement_timeout=120)
    try:
        with psycopg.connect(postgres_dsn) as other:
            other.execute("LOCK TABLE idempotency IN ACCESS EXCLUSIVE MODE")
            busy = asyncio.create_task(store.claim(SCOPE, "hash-a", "r1"))  # holds the only connection
            waiting = "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted"
            await until(lambda: bool(other.execute(waiting).fetchone()[0]),  # type: ignore[index]
                        timeout=5, what="the claim waiting on the lock, on the pool's one connection")
            with pytest.raises(StoreUnavailableError, match="PoolTimeout"):  # tried again for 1 s, then raised
                await store.release(SCOPE, request_id="r1")
            other.rollback()
        assert (await busy).claimed
    finally:
        await store.aclose()


# --- the pipeline -----------------------------------------------------------------------------


async def open_pipeline(dsn: str, tmp_path: Path) -> Pipeline:
    settings = parse_settings({"store": {"postgres_dsn": dsn, "sqlite_path": str(tmp_path / "unused.db")}})
    return await bootstrap.open_pipeline(settings, registry=Registry.from_tools(tools.ALL),
                                policy=EmbeddedEngine.load(bundled_policy_dir()))


async def test_pipeline_over_postgres(postgres_dsn: str, tmp_path: Path) -> None:
    first, second = await open_pipeline(postgres_dsn, tmp_path), await open_pipeline(postgres_dsn, tmp_path)
    try:
        assert isinstance(first.store, PostgresStore) and not (tmp_path / "unused.db").exists()
        note = json.dumps({"text": "x"})
        created = await first.execute(DEVELOPER, CallRequest(tool="create_note", arguments_json=note,
                                                             idempotency_key="k"))
        replay = await second.execute(DEVELOPER, CallRequest(tool="create_note", arguments_json=note,
                                                             idempotency_key="k"))
        assert created.status is Status.SUCCESS and replay.meta.idempotency_replayed and replay.data == created.data
        reused = await second.execute(DEVELOPER, CallRequest(tool="create_note", arguments_json='{"text": "y"}',
                                                             idempotency_key="k"))
        assert reused.error is not None and reused.error.code is ErrorCode.IDEMPOTENCY_KEY_REUSED
        other = await first.execute(ADMIN, CallRequest(tool="create_note", arguments_json=note, idempotency_key="k"))
        assert other.status is Status.SUCCESS and not other.meta.idempotency_replayed

        before = tools.CREATED.value
        duplicate = CallRequest(tool="create_note", arguments_json='{"text": "dup"}', idempotency_key="same")
        results = await asyncio.gather(*(p.execute(DEVELOPER, duplicate) for p in [first, second] * 16))
        assert tools.CREATED.value == before + 1
        assert {r.error.code if r.error else r.status for r in results} <= {Status.SUCCESS,
                                                                            ErrorCode.OPERATION_IN_PROGRESS}
        assert sum(r.status is Status.SUCCESS and not r.meta.idempotency_replayed for r in results) == 1

        await first.store.flush_audit()
        statuses = [e.status for e in await second.store.audit_events()]  # type: ignore[attr-defined]
        # 3 writes ran (dispatching + outcome each), 1 replay, 1 reuse and 31 duplicates were answered
        assert statuses.count("dispatching") == 3 and len(statuses) == 3 * 2 + 2 + 31
    finally:
        await first.aclose()
        await second.aclose()
