"""The migrator on every backend (fixtures of ``test_store_contract``): versions recorded in the database,
applied once, an older schema upgraded keeping its rows, a newer one refused; what later versions add."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from psycopg import AsyncConnection

from sidecar.canonical import sha256_hex
from sidecar.config.store import StoreKind
from sidecar.contract import OperationState
from sidecar.errors import StoreUnavailableError
from sidecar.state import MeterCount, Place
from sidecar.state.chain import EVENT_COLUMNS, GENESIS_HASH, LATER_COLUMNS, verify_store
from sidecar.state.driver import Driver
from sidecar.state.migrate import migrate, migrations
from sidecar.state.postgres import PostgresDriver
from sidecar.state.sqlite import SqliteDriver, SqliteStore
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import SCOPE, SqliteBackend, Stores, event

stores = contract.stores  # the contract suite's fixture: every backend


def backend_name(stores: Stores) -> str:
    return "sqlite" if isinstance(stores.backend, SqliteBackend) else "postgres"


@asynccontextmanager
async def driver_of(stores: Stores) -> AsyncIterator[Driver]:
    """A bare driver on the backend's database: no migration run."""
    if isinstance(stores.backend, SqliteBackend):
        sqlite = await SqliteDriver.open(stores.backend.path)
        try:
            yield sqlite
        finally:
            await sqlite.aclose()
    else:
        async with await AsyncConnection.connect(stores.backend.dsn, autocommit=True) as conn:
            yield PostgresDriver(conn, "test")


def test_every_backend_ships_the_same_versions() -> None:
    for kind in StoreKind:
        known = migrations(kind)
        assert [m.version for m in known] == list(range(1, len(known) + 1))
        assert [m.name for m in known] == [m.name for m in migrations(StoreKind.SQLITE)]


async def test_opening_records_every_version_once(stores: Stores) -> None:
    await asyncio.gather(*(stores.open() for _ in range(4)))  # sidecars starting together
    await stores.open()  # and one more later
    rows = stores.backend.execute("SELECT version, name FROM toolbooth_schema ORDER BY version")
    assert rows == [(m.version, m.name) for m in migrations(backend_name(stores))]


async def test_an_older_schema_is_upgraded_keeping_its_rows(stores: Stores) -> None:
    async with driver_of(stores) as driver:
        assert await migrate(driver, target=1) == 1
    stores.backend.execute("INSERT INTO idempotency (tenant, principal_id, tool, key, request_hash, request_id, "
                           "created_at) VALUES (%s, %s, %s, %s, 'hash-a', 'r0', " +
                           ("0" if backend_name(stores) == "sqlite" else "to_timestamp(0)") + ")",
                           (SCOPE.tenant, SCOPE.principal_id, SCOPE.tool, SCOPE.key))
    old = event(1)
    columns = ("request_id", "time", "principal_id", "tenant", "tool", "tool_version", "input_hash", "decisions_json",
               "policy_revision", "conversation_id", "status", "duration_ms")
    stores.backend.execute(f"INSERT INTO audit ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
                           tuple(getattr(old, c) for c in columns))
    store = await stores.open()
    record = await store.operation(SCOPE)
    assert record is not None and record.request_id == "r0" and record.deadline_at is None
    assert record.state is OperationState.IN_PROGRESS and record.created_at == 0.0
    assert await store.audit_events() == [old]
    [(version,)] = stores.backend.execute("SELECT max(version) FROM toolbooth_schema")
    assert version == len(migrations(backend_name(stores)))


async def test_a_newer_schema_is_refused(stores: Stores) -> None:
    await stores.open()
    stores.backend.execute("INSERT INTO toolbooth_schema (version, name) VALUES (999, '0999_future')")
    newest = len(migrations(backend_name(stores)))
    with pytest.raises(StoreUnavailableError, match=f"schema is at version 999, newer than this sidecar's {newest};"):
        await stores.open()


async def test_a_failing_migration_rolls_back_its_run(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    real = migrations(backend_name(stores))
    broken = [*real[:2], type(real[2])(3, "0003_broken", "CREATE TABLE previews (id integer);\nNOT SQL;\n")]
    monkeypatch.setattr("sidecar.state.migrate.migrations", lambda backend: broken)
    async with driver_of(stores) as driver:
        with pytest.raises(StoreUnavailableError):
            await migrate(driver)
    monkeypatch.undo()
    async with driver_of(stores) as driver:  # nothing of the failed run was kept (no broken previews table)
        assert await migrate(driver) == len(real)
    rows = stores.backend.execute("SELECT version, name FROM toolbooth_schema ORDER BY version")
    assert rows == [(m.version, m.name) for m in real]


async def test_many_stores_opening_a_new_sqlite_file_at_once_all_open(tmp_path: Path) -> None:
    """Switching a new file to WAL needs a moment alone with it, and SQLite refuses at once (no busy wait)
    while another connection is creating or migrating it: every opener retries within its busy timeout."""
    for attempt in range(10):
        path = tmp_path / f"new-{attempt}.db"
        opened = await asyncio.gather(*(SqliteStore.open(path) for _ in range(8)), return_exceptions=True)
        failures = [result for result in opened if isinstance(result, BaseException)]
        for result in opened:
            if isinstance(result, SqliteStore):
                await result.aclose()
        assert not failures, failures


async def test_events_chained_before_the_decision_log_still_verify_after_it(stores: Stores) -> None:
    """Version 6 adds ``decision_ids`` and ``decision_input``: links hashed before them still hold, links with
    them cover them (clearing one breaks the link)."""
    async with driver_of(stores) as driver:
        assert await migrate(driver, target=5) == 5
    old = [event(n) for n in (1, 2)]
    prev = GENESIS_HASH
    columns = [c for c in EVENT_COLUMNS if c not in LATER_COLUMNS]
    for past in old:  # as version 5 linked them: the hash over the columns it had
        values = tuple(getattr(past, c) for c in columns)
        digest = sha256_hex({**dict(zip(columns, values, strict=True)), "prev_hash": prev})
        names = [*columns, "prev_hash", "hash"]
        stores.backend.execute(f"INSERT INTO audit ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})",
                               (*values, prev, digest))
        prev = digest
    store = await stores.open()
    new = event(3, decision_ids='{"authz": "0b7c…"}', decision_input='{"principal":{},"tool":{},"time":"t"}')
    await store.record_audit(new)
    assert await store.audit_events() == [*old, new]
    report = await verify_store(store)
    assert (report.checked, report.broken) == (3, None)
    stores.backend.execute("UPDATE audit SET decision_input = NULL WHERE request_id = 'req-3'")
    broken = (await verify_store(store)).broken
    assert broken is not None and "do not match its hash" in broken.problem


async def test_versions_10_to_12_add_the_history_count_each_key_once_and_tally_meters(stores: Stores) -> None:
    async with driver_of(stores) as driver:
        assert await migrate(driver, target=10) == 10
    for at, name in ((1.0, "k"), (2.0, ""), (3.0, "k"), (4.0, "k2"), (5.0, "k")):
        stores.backend.execute("INSERT INTO toolbooth_history (scope, at, kind, name, tool, detail, amount, "
                               "request_id) VALUES (%s, %s, 'call', %s, 't', '', 1.0, 'r')", ("0" * 32, at, name))
    store = await stores.open()  # migrates to the latest
    kinds = stores.backend.execute("SELECT at, kind FROM toolbooth_history ORDER BY at")
    assert [(float(at), kind) for at, kind in kinds] == [
        (1.0, "call"), (2.0, "call"), (3.0, "retry"), (4.0, "call"), (5.0, "retry")]  # a key counted at its first
    [counted] = (await store.history.reserve([Place("0" * 32, 0.0, 1.0)], now=6.0, tool="t", request_id="r")).counts
    assert counted == MeterCount(3, 3.0, 1.0)
    assert [tuple(map(float, row)) for row in stores.backend.execute(  # version 12: the meter's tally, counted once
        "SELECT since, calls, total FROM toolbooth_history_meters")] == [(0.0, 4.0, 4.0)]
    assert await store.history.expire(7.0) == 6
    if backend_name(stores) == "sqlite":
        indexes = stores.backend.execute("SELECT il.name, group_concat(ii.name) FROM sqlite_master il, "
                                         "pragma_index_info(il.name) ii WHERE il.type = 'index' "
                                         "AND il.tbl_name = 'toolbooth_history' GROUP BY il.name")
    else:
        indexes = stores.backend.execute("SELECT indexname, regexp_replace(indexdef, '[^(]*\\(([^)]*)\\).*', "
                                         "'\\1') FROM pg_indexes WHERE tablename = 'toolbooth_history' "
                                         "AND schemaname = current_schema() AND indexname <> 'toolbooth_history_pkey'")
    assert {name: columns.replace(" ", "") for name, columns in indexes} == {
        "toolbooth_history_scope": "scope,kind,at,amount,name", "toolbooth_history_at": "at",
        "toolbooth_history_key": "name,scope,kind,at,amount"}
