"""A silent network partition between the sidecar and PostgreSQL: calls fail as SERVICE_UNAVAILABLE within
``store.statement_timeout_seconds``, nothing runs, shutdown is bounded, and the store recovers after it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, Status
from sidecar.errors import StoreUnavailableError
from sidecar.state import KeyScope
from sidecar.state.journal import Journal
from sidecar.state.postgres import PostgresStore
from tests.contract.test_audit_cli_postgres import event
from tests.support.sidecar_process import SidecarProcess, appended
from tests.support.tcp_proxy import StallingProxy

pytestmark = pytest.mark.integration
TIMEOUT = 1.0  # store.statement_timeout_seconds in these tests
MARGIN = 2.0  # for a loaded machine: the bound asserted is the timeout plus this


def through(proxy: StallingProxy, dsn: str) -> str:
    return make_conninfo(dsn, host="127.0.0.1", port=proxy.port)


def upstream(dsn: str) -> tuple[str, int]:
    parts = conninfo_to_dict(dsn)
    return str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432)


async def test_a_store_that_gets_no_answer_fails_in_time_and_recovers(postgres_dsn: str) -> None:
    async with StallingProxy.running(upstream(postgres_dsn)) as proxy:
        store = await PostgresStore.open(through(proxy, postgres_dsn), min_size=1, max_size=2, lock_timeout_ms=200,
                                         statement_timeout=TIMEOUT)
        scope = KeyScope("acme", "dev-1", "create_note", "k")
        try:
            assert (await store.claim(scope, "hash", "r1")).claimed
            proxy.stall()
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match=r"no answer within 1.0 s"):
                await store.operation(scope)
            assert time.monotonic() - started < TIMEOUT + MARGIN
            proxy.resume()  # the severed connection was dropped; the pool opens another
            record = await store.operation(scope)
            assert record is not None and record.request_id == "r1"
        finally:
            proxy.stall()
            started = time.monotonic()
            await store.aclose()
            assert time.monotonic() - started < TIMEOUT + MARGIN



async def test_closing_a_partitioned_store_with_writes_to_keep_is_bounded_by_its_timeouts(postgres_dsn: str,
                                                                                        tmp_path: Path) -> None:
    """Not by the pool's wait for a connection (``connect_timeout``, long here): once a statement went
    unanswered, the kept writes' replay and the last tries wait ``down_wait`` for one."""
    async with StallingProxy.running(upstream(postgres_dsn)) as proxy:
        store = await PostgresStore.open(through(proxy, postgres_dsn), min_size=1, max_size=2, connect_timeout=8,
                                         lock_timeout_ms=200, statement_timeout=TIMEOUT)
        journal = Journal.open(tmp_path / "store.journal", "test")
        await store.keep_in(journal)
        scope = KeyScope("acme", "dev-1", "create_note", "k")
        assert (await store.claim(scope, "hash", "r1")).claimed
        proxy.stall()
        await store.complete(scope, "{}", request_id="r1")  # unanswered: kept in the journal
        for n in range(5):
            store.queue_audit(event(n))
        started = time.monotonic()
        await store.aclose()
        took = time.monotonic() - started
    assert took < 2 * TIMEOUT + MARGIN, f"closing took {took:.1f} s"
    assert Journal.open(tmp_path / "store.journal", "test").size == 2  # the outcome and the batch, for the next start

async def test_a_partitioned_sidecar_answers_unavailable_runs_nothing_and_stops(postgres_dsn: str,
                                                                               tmp_path: Path) -> None:
    log = tmp_path / "executions.log"
    async with StallingProxy.running(upstream(postgres_dsn)) as proxy:
        config = tmp_path / "sidecar.json"
        config.write_text(json.dumps({
            "server": {"listen": [f"unix://{tmp_path / 's.sock'}"], "shutdown_grace_seconds": 1},
            "policy": {"reload_interval_seconds": 0},
            "store": {"postgres_dsn": through(proxy, postgres_dsn), "sqlite_path": str(tmp_path / "unused.db"),
                      "busy_timeout_ms": 200, "statement_timeout_seconds": TIMEOUT},
        }))
        sidecar = SidecarProcess(config, tmp_path / "s.sock", tmp_path / "s.err", log)
        try:
            await sidecar.wait_serving()
            async with AsyncClient(sidecar.target, timeout=30) as client:
                ok = await client.execute("append_line", {"text": "before"}, idempotency_key="k-1")
                assert ok.status is Status.SUCCESS, ok
                proxy.stall()
                started = time.monotonic()
                cut = await client.execute("append_line", {"text": "during"}, idempotency_key="k-2")
                took = time.monotonic() - started
            assert cut.error is not None and cut.error.code is ErrorCode.SERVICE_UNAVAILABLE and cut.error.retryable
            assert took < TIMEOUT + MARGIN, f"the call took {took:.1f} s"
            assert [line.split()[1] for line in appended(log)] == ["before"]  # nothing ran during the partition
            started = time.monotonic()
            assert sidecar.stop(timeout=15) == 0, sidecar.output()  # SIGTERM was enough: no SIGKILL
            assert time.monotonic() - started < 1 + 3 * TIMEOUT + MARGIN, sidecar.output()
        finally:
            sidecar.stop()
