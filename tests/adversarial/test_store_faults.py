"""Store failures injected at every write of a keyed call, through a real server (issue 8, defect 3).

Faults: on SQLite, triggers that abort the statement; on PostgreSQL, privileges revoked from the
sidecar's own role (and a trigger for the dispatch event alone, which no privilege singles out).
Points: the claim; the dispatch event (alone, and with the release of the key after it); while the
handler runs, the result write, the outcome event, or both.

The promises checked after every fault: a call refused before its handler ran is retryable and its key
is free once the store is back (0 executions without a record); a call whose handler ran gets its real
result, and once the store is back a retry replays exactly that result and the audit log holds its
events (0 lost outcomes: what the store could not take was kept in the local journal and applied); the
audit chain verifies; shutdown with the store failing is bounded. A seeded campaign runs
``TOOLBOOTH_STORE_FAULTS`` faults (default 60 on SQLite, 24 on PostgreSQL) at random points.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.server import Sidecar, create_server
from sidecar.state import lasting, verify_store
from sidecar.state.sql_store import SqlStore
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import make_settings, socket_path
from tests.support.history import with_meters
from tests.support.postgres import PostgresServer
from tests.support.tcp_proxy import StallingProxy
from tests.support.tools import Count, Counter, Gate, Text
from tests.support.waiting import until

__all__ = ["make_settings", "postgres", "postgres_dsn", "socket_path"]

pytestmark = pytest.mark.integration
WAIT = 20.0  # seconds: the deadline of every wait for an event
BEFORE = ("claim", "dispatch", "dispatch+release")  # faults that refuse the call before its handler runs
DURING = ("result", "outcome", "result+outcome")  # faults injected while the handler runs
EFFECTS: collections.Counter[str] = collections.Counter()  # executions per text
STARTED, HOLD = Counter(), Gate()


@tool(name="record_effect", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=30)
async def record_effect(args: Text, ctx: ToolContext) -> Count:
    """A write: counts its executions per text, then waits for ``HOLD`` (open unless a test closes it)."""
    EFFECTS[args.text] += 1
    STARTED.bump()
    await HOLD.passed()
    return Count(count=EFFECTS[args.text])


class Faults(Protocol):
    """Injects and heals the faults of one store, from a thread of its own: the sidecar under test shares the
    test's event loop, and a statement waiting for a lock on it would stop the sidecar that holds the lock."""

    def inject(self, point: str) -> None: ...
    def heal(self) -> None: ...


async def inject(faults: Faults, point: str) -> None:
    await asyncio.to_thread(faults.inject, point)


async def heal(faults: Faults) -> None:
    await asyncio.to_thread(faults.heal)


class SqliteFaults:
    """Triggers on the store's file that abort the statements of a point."""

    TRIGGERS: ClassVar[dict[str, list[str]]] = {"claim": ["BEFORE INSERT ON idempotency"],
                                                "release": ["BEFORE DELETE ON idempotency"],
                                                "result": ["BEFORE UPDATE OF result_json ON idempotency"],
                                                "dispatch": ["BEFORE INSERT ON audit WHEN NEW.status = 'dispatching'"],
                                                "outcome": ["BEFORE INSERT ON audit WHEN NEW.status <> 'dispatching'"]}

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._made: list[str] = []

    def inject(self, point: str) -> None:
        for part in point.split("+"):
            for n, when in enumerate(self.TRIGGERS[part]):
                name = f"fault_{part}_{n}"
                self._db.execute(f"CREATE TRIGGER {name} {when} BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
                self._made.append(name)

    def heal(self) -> None:
        while self._made:
            self._db.execute(f"DROP TRIGGER {self._made.pop()}")


class PostgresFaults:
    """Privileges revoked from the sidecar's role; the dispatch event alone refused by a trigger."""

    PRIVILEGES: ClassVar[dict[str, str]] = {"claim": "INSERT", "release": "DELETE", "result": "UPDATE"}

    def __init__(self, server: PostgresServer, dsn: str, role: str) -> None:
        self._server, self._dsn, self._role = server, dsn, role
        self._healing: list[sql.Composed] = []
        self._run(sql.SQL("CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS "
                          "$$ BEGIN RAISE EXCEPTION 'injected fault'; END $$"))

    def inject(self, point: str) -> None:
        role = sql.Identifier(self._role)
        for part in point.split("+"):
            if part in self.PRIVILEGES:
                privilege = sql.SQL(self.PRIVILEGES[part])
                self._run(sql.SQL("REVOKE {} ON idempotency FROM {}").format(privilege, role))
                self._healing.append(sql.SQL("GRANT {} ON idempotency TO {}").format(privilege, role))
            else:
                condition = "=" if part == "dispatch" else "<>"
                name = sql.Identifier(f"fault_{part}")
                self._run(sql.SQL("CREATE TRIGGER {} BEFORE INSERT ON audit FOR EACH ROW WHEN (NEW.status {} "
                                  "'dispatching') EXECUTE FUNCTION fault()").format(name, sql.SQL(condition)))
                self._healing.append(sql.SQL("DROP TRIGGER {} ON audit").format(name))

    def heal(self) -> None:
        while self._healing:
            self._run(self._healing.pop())

    def _run(self, statement: sql.Composed | sql.SQL) -> None:
        self._server.execute(statement, dsn=self._dsn)


@dataclass
class World:
    """One sidecar (dev mode, TCP) over a store with its local journal, and the faults of that store."""

    settings: Settings
    faults: Faults
    sidecar: Sidecar | None = None
    pipeline: Pipeline | None = None
    clients: list[AsyncClient] = field(default_factory=list)

    async def start(self) -> None:
        self.pipeline = await open_pipeline(self.settings, registry=Registry.from_tools([record_effect]))
        _, self.sidecar = await create_server(self.settings, self.pipeline)
        await self.sidecar.start()

    async def stop(self) -> float:
        """Stop the sidecar; how long it took."""
        started = time.monotonic()
        await asyncio.gather(*(client.close() for client in self.clients))
        self.clients.clear()
        if self.sidecar is not None:
            await self.sidecar.stop(None)
        if self.pipeline is not None:
            await self.pipeline.aclose()
        self.sidecar = self.pipeline = None
        return time.monotonic() - started

    @property
    def store(self) -> SqlStore:
        assert self.pipeline is not None
        store = self.pipeline.store
        assert isinstance(store, SqlStore)
        return store

    @property
    def agent(self) -> AsyncClient:
        assert self.sidecar is not None
        self.clients.append(client := AsyncClient(self.sidecar.addresses[-1], timeout=60))
        return client

    async def call(self, text: str, key: str) -> ToolResult:
        return await self.agent.execute("record_effect", {"text": text}, idempotency_key=key)

    async def caught_up(self) -> None:
        """Wait until the store has taken the queued audit events and every write its journal kept."""
        await self.store.flush_audit()
        await until(lambda: self.store.kept_writes == 0, timeout=WAIT, what="the local journal emptied")


@contextlib.asynccontextmanager
async def opened(settings: Settings, faults: Callable[[], Faults]) -> AsyncIterator[World]:
    """A started world whose faults (made once its store exists) are healed, and it stopped, on leaving."""
    world = World(settings, _Unmade())
    await world.start()
    world.faults = faults()
    try:
        yield world
    finally:
        HOLD.open()
        await heal(world.faults)
        await world.stop()


class _Unmade:
    """The faults of a world not started yet."""

    def inject(self, point: str) -> None:
        raise AssertionError("faults are made once the world has started")

    def heal(self) -> None:
        pass


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing write is tried again for 50 ms, not 1 s, before it is kept: the campaign stays short."""
    monkeypatch.setattr(lasting, "RETRY_SECONDS", 0.05)
    HOLD.open()


@pytest.fixture(params=["sqlite", "postgres"])
async def world(request: pytest.FixtureRequest, tmp_path: Path,
                make_settings: Callable[..., Settings]) -> AsyncIterator[World]:
    journal = str(tmp_path / "kept.journal")
    policy = {"path": str(with_meters(tmp_path / "policies"))}  # faults, not the default limit of writes, refuse
    if request.param == "sqlite":
        settings = make_settings(store={"journal_file": journal}, policy=policy)
        async with opened(settings, lambda: SqliteFaults(settings.store.sqlite_path)) as made:
            yield made
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    async with postgres_role(server, request.getfixturevalue("postgres_dsn")) as (owner, as_role, role):
        settings = make_settings(store={"journal_file": journal, "postgres_dsn": as_role, "busy_timeout_ms": 500,
                                        "statement_timeout_seconds": 5}, policy=policy)
        async with opened(settings, lambda: PostgresFaults(server, owner, role)) as made:
            yield made


@contextlib.asynccontextmanager
async def postgres_role(server: PostgresServer, dsn: str) -> AsyncIterator[tuple[str, str, str]]:
    """A login role of its own with every privilege on the test's schema, which the test owner migrates
    first: (the owner's DSN, the role's DSN, the role's name). Dropped on leaving."""
    from sidecar.state.postgres import PostgresStore

    role = f"tb_fault_{uuid.uuid4().hex[:10]}"
    await (await PostgresStore.open(dsn)).aclose()  # the schema, migrated by its owner
    ident = sql.Identifier(role)
    schema = server.execute(sql.SQL("SELECT current_schema()"), dsn=dsn)[0][0]
    server.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident), dsn=dsn)
    for grant in ("GRANT USAGE ON SCHEMA {s} TO {r}", "GRANT ALL ON ALL TABLES IN SCHEMA {s} TO {r}",
                  "GRANT ALL ON ALL SEQUENCES IN SCHEMA {s} TO {r}"):
        server.execute(sql.SQL(grant).format(s=sql.Identifier(schema), r=ident), dsn=dsn)
    try:
        yield dsn, make_conninfo(dsn, user=role), role
    finally:
        for statement in ("DROP OWNED BY {r}", "DROP ROLE {r}"):
            server.execute(sql.SQL(statement).format(r=ident), dsn=dsn)


async def fault_before(world: World, point: str, text: str, key: str) -> ToolResult:
    """Inject ``point`` and call: the call is refused, retryable, and ran nothing."""
    await inject(world.faults, point)
    refused = await world.call(text, key)
    await heal(world.faults)
    assert refused.status is Status.ERROR and refused.error is not None, refused
    assert refused.error.code is ErrorCode.SERVICE_UNAVAILABLE and refused.error.retryable, refused
    assert EFFECTS[text] == 0, f"{point}: the handler ran although the call was refused"
    return refused


async def fault_during(world: World, point: str, text: str, key: str, *, then_heal: bool = True) -> ToolResult:
    """Call, and inject ``point`` while the handler runs: the caller gets the handler's real result."""
    HOLD.close()
    started = STARTED.value
    call = asyncio.create_task(world.call(text, key))
    await STARTED.reached(started + 1, timeout=WAIT)
    await inject(world.faults, point)
    HOLD.open()
    result = await call
    if then_heal:
        await heal(world.faults)
    assert result.status is Status.SUCCESS and result.data == {"count": 1}, (point, result)
    return result


async def settles(world: World, text: str, key: str, first: ToolResult) -> ToolResult:
    """Retry once the store is back: a refused call runs now, once; a call that ran is replayed."""
    retried = await world.call(text, key)
    assert retried.status is Status.SUCCESS and retried.data == {"count": 1}, retried
    assert EFFECTS[text] == 1, f"{text} ran {EFFECTS[text]} times"
    if first.status is Status.SUCCESS:  # the stored result: the first call's own duration
        assert retried.meta.idempotency_replayed and retried.meta.duration_ms == first.meta.duration_ms, retried
    else:
        assert not retried.meta.idempotency_replayed, retried
    return retried


async def audited_once(world: World, answered: list[ToolResult]) -> None:
    """Every answered call has exactly one outcome event; every execution exactly one dispatch event;
    the chain verifies."""
    await world.caught_up()
    events = await world.store.audit_events()
    outcomes = collections.Counter(e.request_id for e in events if e.status != "dispatching")
    dispatches = collections.Counter(e.request_id for e in events if e.status == "dispatching")
    ran = [r for r in answered if r.status is Status.SUCCESS and not r.meta.idempotency_replayed]
    lost = [r.meta.request_id for r in answered if outcomes[r.meta.request_id] != 1]
    assert not lost, f"{len(lost)} outcome event(s) lost or doubled: {lost[:5]}"
    assert all(dispatches[r.meta.request_id] == 1 for r in ran), dispatches
    report = await verify_store(world.store)
    assert report.broken is None and report.checked == len(events), report


@pytest.mark.parametrize("point", BEFORE)
async def test_a_fault_before_the_handler_runs_nothing_and_frees_the_key(world: World, point: str) -> None:
    text, key = f"before-{point}-{uuid.uuid4().hex[:6]}", f"k-{point}"
    refused = await fault_before(world, point, text, key)
    answered = [refused, await settles(world, text, key, refused)]
    await audited_once(world, answered)


@pytest.mark.parametrize("point", DURING)
async def test_a_fault_while_the_handler_runs_loses_no_outcome(world: World, point: str) -> None:
    text, key = f"during-{point}-{uuid.uuid4().hex[:6]}", f"k-{point}"
    ran = await fault_during(world, point, text, key)
    if "result" in point:
        assert world.store.kept_writes >= 1  # the result is in the local journal, not lost
    answered = [ran, await settles(world, text, key, ran)]
    operation = await world.agent.get_operation("record_effect", key)
    assert operation.result == ran
    await audited_once(world, answered)


async def test_kept_writes_survive_a_restart_and_are_applied_at_start(world: World) -> None:
    text, key = f"restart-{uuid.uuid4().hex[:6]}", "k-restart"
    ran = await fault_during(world, "result+outcome", text, key, then_heal=False)
    assert world.store.kept_writes >= 1
    took = await world.stop()  # the store is still failing
    assert took < 15, f"shutdown took {took:.1f} s with the store failing"
    await heal(world.faults)
    await world.start()
    assert world.store.kept_writes == 0  # applied at start
    answered = [ran, await settles(world, text, key, ran)]
    await audited_once(world, answered)


async def test_a_seeded_campaign_of_faults_loses_nothing(world: World) -> None:
    """Random fault points (seeded); after each, the store comes back and the call is retried."""
    is_postgres = world.settings.store.postgres_dsn is not None
    count = int(os.environ.get("TOOLBOOTH_STORE_FAULTS", "24" if is_postgres else "60"))
    rng = random.Random(8)
    answered: list[ToolResult] = []
    for n in range(count):
        point = rng.choice(BEFORE + DURING)
        text, key = f"campaign-{n}-{uuid.uuid4().hex[:6]}", f"k-{n}"
        first = await (fault_before if point in BEFORE else fault_during)(world, point, text, key)
        answered += [first, await settles(world, text, key, first)]
    await audited_once(world, answered)


class _Healthy:
    """No faults of its own: the test partitions the network instead."""

    def inject(self, point: str) -> None:
        raise AssertionError(f"no fault {point!r} here")

    def heal(self) -> None:
        pass


async def test_a_partition_while_the_handler_runs_loses_no_outcome(postgres_dsn: str, tmp_path: Path,
                                                                   make_settings: Callable[..., Settings]) -> None:
    """PostgreSQL goes silent (a TCP proxy holds every byte) while a write's handler runs: the result write
    and the outcome event get no answer within the statement timeout, so both are kept; once the network is
    back a retry replays the real result, and shutdown during the partition is bounded."""
    parts = conninfo_to_dict(postgres_dsn)
    upstream = (str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432))
    async with StallingProxy.running(upstream) as proxy:
        settings = make_settings(store={"journal_file": str(tmp_path / "kept.journal"), "busy_timeout_ms": 200,
                                        "postgres_dsn": make_conninfo(postgres_dsn, host="127.0.0.1",
                                                                      port=proxy.port),
                                        "statement_timeout_seconds": 1})
        async with opened(settings, _Healthy) as world:
            text, key = f"partition-{uuid.uuid4().hex[:6]}", "k-partition"
            HOLD.close()
            started = STARTED.value
            call = asyncio.create_task(world.call(text, key))
            await STARTED.reached(started + 1, timeout=WAIT)
            proxy.stall()
            HOLD.open()
            ran = await call
            assert ran.status is Status.SUCCESS and ran.data == {"count": 1}, ran
            assert world.store.kept_writes >= 1
            took = await world.stop()  # a grace of 2 s and statement timeouts of 1 s; a loaded machine's margin
            assert took < 15, f"shutdown took {took:.1f} s during the partition"
            proxy.resume()
            await world.start()
            answered = [ran, await settles(world, text, key, ran)]
            await audited_once(world, answered)
