"""A signed audit checkpoint only ever extends the one before it (issue 23, item 1), on both stores.

A real sidecar process with a chain key takes calls and stops, writing its checkpoint; then the database is
changed as someone who can write it but lacks the key would: the newest events deleted (with the sidecar
stopped, or while it runs), an event rewritten and every link recomputed unkeyed, every hash cleared, the
checkpoint file put back to an older one, a later chain rewritten. The sidecar restarted (or at its next
checkpoint) must not sign what it finds, and the real ``toolbooth audit verify`` exits 1 naming it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sidecar.client import AsyncClient
from sidecar.contract import Status
from sidecar.state import Store
from sidecar.state.chain import EVENT_COLUMNS, GENESIS_HASH, event_hash
from sidecar.state.postgres import PostgresStore
from sidecar.state.sqlite import SqliteStore
from tests.support.cli import cli_env, toolbooth
from tests.support.sidecar_process import SidecarProcess
from tests.support.waiting import until

pytestmark = pytest.mark.integration

KEY = "a chain key of at least sixteen bytes"
NOT_WRITTEN = "audit checkpoint not written"  # what the sidecar logs instead of signing a log it cannot extend
PRINCIPAL = EVENT_COLUMNS.index("principal_id")


class Log:
    """A store's database, written directly (``%s`` parameters), and how a sidecar is configured to use it."""

    def __init__(self, store: dict[str, Any], execute: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]],
                 open_store: Callable[[], Awaitable[Store]]) -> None:
        self.store, self.execute, self.open_store = store, execute, open_store

    async def rewrite(self, mallory_at: int, chain: int | None = None) -> None:
        """What someone without the key can do: make the ``mallory_at``-th event (from 0) of the log (or of
        ``chain``) another principal's, then recompute every link of every chain (or of ``chain``), unkeyed."""
        store = await self.open_store()
        try:
            starts = {start.chain: start.link_hash for start in await store.audit_chains()}
            records = [r for r in await store.audit_records() if chain in (None, r.chain)]
        finally:
            await store.aclose()
        last: dict[int, str] = {}
        for n, record in enumerate(records):
            fields = list(astuple(record.event))
            if n == mallory_at:
                fields[PRINCIPAL] = "mallory"
            prev = last.get(record.chain) or starts.get(record.chain) or GENESIS_HASH
            last[record.chain] = event_hash(tuple(fields), prev)
            self.execute("UPDATE audit SET principal_id = %s, prev_hash = %s, hash = %s WHERE id = %s",
                         (fields[PRINCIPAL], prev, last[record.chain], record.id))

    def delete_newest(self, n: int) -> None:
        self.execute("DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY id DESC LIMIT %s)", (n,))


def sqlite_log(db: Path) -> Log:
    def execute(query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with sqlite3.connect(db) as conn:
            return conn.execute(query.replace("%s", "?"), params).fetchall()

    return Log({"sqlite_path": str(db)}, execute, lambda: SqliteStore.open(db))


def postgres_log(dsn: str, unused: Path) -> Log:
    def execute(query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cursor = conn.execute(query.encode(), params)
            return cursor.fetchall() if cursor.description else []

    return Log({"postgres_dsn": dsn, "sqlite_path": str(unused)}, execute, lambda: PostgresStore.open(dsn))


@pytest.fixture(params=["sqlite", "postgres"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Log:
    if request.param == "sqlite":
        return sqlite_log(tmp_path / "toolbooth.db")
    return postgres_log(request.getfixturevalue("postgres_dsn"), tmp_path / "unused.db")


class Deployment:
    """One sidecar's configuration (the store of ``log``, a chain key, a checkpoint every ``interval`` seconds,
    0: at shutdown only), the processes started from it and ``toolbooth audit verify`` with it."""

    def __init__(self, tmp_path: Path, log: Log) -> None:
        self.home, self.log = tmp_path, log
        self.checkpoint = tmp_path / "audit.checkpoint"
        self.config = tmp_path / "toolbooth.json"
        self.started: list[SidecarProcess] = []
        self.calls = 0

    async def start(self, interval: float = 0) -> SidecarProcess:
        self.config.write_text(json.dumps({
            "server": {"listen": [f"unix://{self.home / 's.sock'}"], "shutdown_grace_seconds": 1},
            "policy": {"reload_interval_seconds": 0},
            "store": {**self.log.store, "journal_file": str(self.home / "store.journal")},
            "audit": {"chain_key": KEY, "checkpoint_file": str(self.checkpoint),
                      "checkpoint_interval_seconds": interval},
        }))
        n = len(self.started)
        sidecar = SidecarProcess(self.config, self.home / "s.sock", self.home / f"s{n}.err", self.home / "appended")
        self.started.append(sidecar)
        await sidecar.wait_serving()
        return sidecar

    async def call(self, sidecar: SidecarProcess, n: int) -> None:
        """``n`` writes: two events each (dispatching, then the outcome)."""
        async with AsyncClient(sidecar.target, timeout=10) as client:
            for _ in range(n):
                self.calls += 1
                text = f"w{self.calls}"
                result = await client.execute("append_line", {"text": text}, idempotency_key=text)
                assert result.status is Status.SUCCESS, result.error

    async def run(self, calls: int = 0) -> str:
        """Start, make ``calls`` writes, stop (the checkpoint is written then); the sidecar's output."""
        sidecar = await self.start()
        await self.call(sidecar, calls)
        return self.stop(sidecar)

    def stop(self, sidecar: SidecarProcess) -> str:
        assert sidecar.stop() == 0, sidecar.output()
        return sidecar.output()

    def counted(self) -> int:
        """The links the checkpoint file counts, over its chains (0 before it exists)."""
        if not self.checkpoint.exists():
            return 0
        return sum(chain["count"] for chain in json.loads(self.checkpoint.read_text())["chains"])

    async def verify(self) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(toolbooth, "audit", "verify", "--config", str(self.config),
                                       env=cli_env(self.home))


@pytest.fixture
async def deployment(tmp_path: Path, log: Log) -> AsyncIterator[Deployment]:
    deployed = Deployment(tmp_path, log)
    yield deployed
    for sidecar in deployed.started:
        sidecar.stop()


def assert_reported(verified: subprocess.CompletedProcess[str], problem: str) -> None:
    assert verified.returncode == 1 and problem in verified.stdout, verified.stdout + verified.stderr


async def test_deleting_the_newest_events_shows_after_a_restart(deployment: Deployment) -> None:
    await deployment.run(calls=6)
    deployment.log.delete_newest(5)
    assert_reported(await deployment.verify(), "events removed after the checkpoint")
    signed = deployment.checkpoint.read_bytes()
    output = await deployment.run()  # no calls: only its checkpoint at shutdown
    assert_reported(await deployment.verify(), "events removed after the checkpoint")
    assert NOT_WRITTEN in output and deployment.checkpoint.read_bytes() == signed, output


async def test_events_deleted_while_the_sidecar_runs_are_never_signed(deployment: Deployment) -> None:
    sidecar = await deployment.start(interval=0.05)
    await deployment.call(sidecar, 6)
    await until(lambda: deployment.counted() == 12, what="a checkpoint of every event")
    signed = deployment.checkpoint.read_bytes()
    deployment.log.delete_newest(5)
    await until(lambda: deployment.checkpoint.read_bytes() != signed or NOT_WRITTEN in sidecar.output(),
                what="the next checkpoint")
    output = deployment.stop(sidecar)
    assert_reported(await deployment.verify(), "events removed after the checkpoint")
    assert NOT_WRITTEN in output, output


async def test_an_event_rewritten_and_relinked_unkeyed_is_never_signed(deployment: Deployment) -> None:
    await deployment.run(calls=6)
    await deployment.log.rewrite(mallory_at=3)
    assert_reported(await deployment.verify(), "head not found")
    output = await deployment.run()
    assert_reported(await deployment.verify(), "head not found")
    assert NOT_WRITTEN in output, output


async def test_a_log_whose_hashes_were_cleared_is_never_signed(deployment: Deployment) -> None:
    await deployment.run(calls=6)
    deployment.log.execute("UPDATE audit SET prev_hash = NULL, hash = NULL", ())  # "from before the chain"
    output = await deployment.run(calls=1)  # a new chain from the genesis on
    assert_reported(await deployment.verify(), "events removed after the checkpoint")
    assert NOT_WRITTEN in output, output


async def test_an_older_checkpoint_put_back_over_a_cut_log_is_replaced_by_the_newest(deployment: Deployment) -> None:
    sidecar = await deployment.start(interval=0.05)
    await deployment.call(sidecar, 3)
    await until(lambda: deployment.counted() == 6, what="the first checkpoint")
    older = deployment.checkpoint.read_bytes()
    await deployment.call(sidecar, 3)
    await until(lambda: deployment.counted() == 12, what="the second checkpoint")
    deployment.log.delete_newest(6)  # back to where the older checkpoint was ...
    deployment.checkpoint.write_bytes(older)  # ... and that checkpoint put back
    await until(lambda: deployment.checkpoint.read_bytes() != older or NOT_WRITTEN in sidecar.output(),
                what="the next checkpoint")
    output = deployment.stop(sidecar)
    assert_reported(await deployment.verify(), "events removed after the checkpoint")
    assert NOT_WRITTEN in output and deployment.counted() == 12, output


@pytest.mark.parametrize("damage", ["relinked unkeyed", "hashes cleared"])
async def test_a_later_chain_rewritten_without_the_key_is_a_broken_link(postgres_dsn: str, tmp_path: Path,
                                                                       damage: str) -> None:
    """On PostgreSQL each sidecar start appends to a chain of its own: one not yet covered by a checkpoint (its
    sidecar was killed) must be keyed all the same, its first link following the keyed links before it."""
    deployment = Deployment(tmp_path, postgres_log(postgres_dsn, tmp_path / "unused.db"))
    await deployment.run(calls=3)
    sidecar = await deployment.start()
    await deployment.call(sidecar, 3)
    sidecar.process.kill()  # no checkpoint at shutdown: its chain is newer than the checkpoint
    sidecar.process.wait()
    [(chain, first)] = deployment.log.execute("SELECT chain_id, min(id) FROM audit GROUP BY chain_id "
                                              "ORDER BY chain_id DESC LIMIT 1", ())
    if damage == "hashes cleared":
        deployment.log.execute("UPDATE audit SET prev_hash = NULL, hash = NULL WHERE chain_id = %s", (chain,))
    else:
        await deployment.log.rewrite(mallory_at=0, chain=chain)
    verified = await deployment.verify()
    assert verified.returncode == 1 and f"audit chain BROKEN at event id {first}" in verified.stdout, verified.stdout
