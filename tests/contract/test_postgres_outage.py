"""PostgreSQL restarting under a sidecar with keyed writes in flight (every connection reset, new ones refused,
then back): each call answers within the store's timeouts, those of the outage as SERVICE_UNAVAILABLE
(retryable) and fast, nothing runs twice, nothing acknowledged is missing, the chain verifies, and writes
succeed again soon after the database is back."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, Status
from sidecar.errors import StoreUnavailableError
from sidecar.state import KeyScope
from sidecar.state.postgres import PostgresStore
from tests.contract.test_postgres_partition import through, upstream
from tests.support.history import with_meters
from tests.support.postgres import PostgresServer
from tests.support.sidecar_process import SidecarProcess, appended
from tests.support.tcp_proxy import StallingProxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration
STATEMENT_TIMEOUT, CONNECT_TIMEOUT, DOWN_WAIT = 1.0, 3.0, 0.2  # store.* of the sidecar under test
MARGIN = 2.0  # for a loaded machine
BOUND = CONNECT_TIMEOUT + STATEMENT_TIMEOUT + MARGIN  # every answer, outage or not
FAST = DOWN_WAIT + 1.0  # the median refusal during the outage: well within the pool's full wait
WRITERS = 16
OUTAGE = 4.0  # seconds the database is cut off


@dataclass(frozen=True)
class Call:
    key: str
    sent: float
    took: float
    status: Status
    code: ErrorCode | None
    retryable: bool


async def test_a_restarting_database_gets_fast_typed_refusals_and_loses_nothing(
        postgres: PostgresServer, postgres_dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "executions.log"
    config = tmp_path / "sidecar.json"
    calls: list[Call] = []
    acknowledged: set[str] = set()
    keys = (f"k-{n}" for n in itertools.count())
    stop = asyncio.Event()

    async def writer(client: AsyncClient) -> None:
        while not stop.is_set():
            key, sent = next(keys), time.monotonic()
            result = await client.execute("append_line", {"text": key}, idempotency_key=key)
            error = result.error
            calls.append(Call(key, sent, time.monotonic() - sent, result.status, error and error.code,
                              bool(error and error.retryable)))

    async with StallingProxy.running(upstream(postgres_dsn)) as proxy:
        config.write_text(json.dumps({
            "server": {"listen": [f"unix://{tmp_path / 's.sock'}"], "shutdown_grace_seconds": 1},
            "policy": {"path": str(with_meters(tmp_path / "policies")), "reload_interval_seconds": 0},  # no limit
            "store": {"postgres_dsn": through(proxy, postgres_dsn), "sqlite_path": str(tmp_path / "unused.db"),
                      "journal_file": str(tmp_path / "store.journal"), "busy_timeout_ms": 200,
                      "statement_timeout_seconds": STATEMENT_TIMEOUT, "connect_timeout_seconds": CONNECT_TIMEOUT,
                      "down_wait_seconds": DOWN_WAIT},
        }))
        sidecar = SidecarProcess(config, tmp_path / "s.sock", tmp_path / "s.err", log)
        try:
            await sidecar.wait_serving()
            async with AsyncClient(sidecar.target, timeout=30) as client:
                writers = [asyncio.create_task(writer(client)) for _ in range(WRITERS)]
                await until(lambda: sum(c.status is Status.SUCCESS for c in calls) >= 20, timeout=20,
                            what="writes before the outage")
                proxy.cut()
                cut = time.monotonic()
                await until(lambda: time.monotonic() - cut >= OUTAGE, timeout=OUTAGE + 5, what="the outage")
                await proxy.restore()
                back = time.monotonic()
                await until(lambda: any(c.sent > back and c.status is Status.SUCCESS for c in calls), timeout=10,
                            what="a write sent after the database is back succeeding")
                recovered = min(c.sent + c.took for c in calls if c.sent > back and c.status is Status.SUCCESS)
                stop.set()
                await asyncio.gather(*writers)
                refused = [c for c in calls if c.status is not Status.SUCCESS]
                # retried after the outage: runs once, replays, or is held by its claim (whose answer was lost)
                retried = await asyncio.gather(*(client.execute("append_line", {"text": call.key},
                                                                   idempotency_key=call.key) for call in refused))
                for call, again in zip(refused, retried, strict=True):
                    assert again.status is Status.SUCCESS or (
                        again.error is not None and again.error.code is ErrorCode.OPERATION_IN_PROGRESS), again
                    if again.status is Status.SUCCESS:
                        acknowledged.add(call.key)
            # off the loop: the proxy runs on it, and the sidecar's last writes go through it
            assert await asyncio.to_thread(sidecar.stop, 15) == 0, sidecar.output()
        finally:
            await asyncio.to_thread(sidecar.stop)

    slowest = max(calls, key=lambda c: c.took)
    assert slowest.took < BOUND, f"{slowest} took longer than {BOUND} s"
    during = sorted(c.took for c in refused if c.sent >= cut)
    assert refused and all(c.code is ErrorCode.SERVICE_UNAVAILABLE and c.retryable for c in refused), refused
    assert during and during[len(during) // 2] < FAST, f"median refusal {during[len(during) // 2]:.2f} s"
    assert recovered - back < 10, f"writes back {recovered - back:.1f} s after the database"
    executed = [line.split()[1] for line in appended(log)]
    assert len(executed) == len(set(executed)) and set(executed) <= {c.key for c in calls}, "a key ran twice"
    acknowledged.update(c.key for c in calls if c.status is Status.SUCCESS)
    assert acknowledged <= set(executed), "a write acknowledged but never run"
    audited = {key for (key,) in postgres.execute(
        "SELECT idempotency_key FROM audit WHERE tool = 'append_line' AND status = 'success'", dsn=postgres_dsn)}
    missing = acknowledged - audited
    assert not missing, (missing, [c for c in calls if c.key in missing], postgres.execute(
        "SELECT idempotency_key, status, error_code FROM audit WHERE idempotency_key = ANY(%s)", (list(missing),),
        dsn=postgres_dsn), sidecar.output()[-3000:])
    direct = tmp_path / "direct.json"
    direct.write_text(json.dumps({"store": {"postgres_dsn": postgres_dsn}}))
    assert await asyncio.to_thread(main, ["audit", "verify", "--config", str(direct)]) == 0


async def test_a_store_fails_fast_while_its_database_is_down_and_recovers_once_it_is_back(postgres_dsn: str) -> None:
    async with StallingProxy.running(upstream(postgres_dsn)) as proxy:
        store = await PostgresStore.open(through(proxy, postgres_dsn), max_size=2, connect_timeout=CONNECT_TIMEOUT,
                                         lock_timeout_ms=200, statement_timeout=STATEMENT_TIMEOUT, down_wait=DOWN_WAIT)
        scope = KeyScope("acme", "dev-1", "create_note", "k")

        async def answers() -> bool:
            try:
                return await store.operation(scope) is not None
            except StoreUnavailableError:
                return False

        try:
            assert (await store.claim(scope, "hash", "r1")).claimed
            proxy.cut()
            with pytest.raises(StoreUnavailableError):
                await store.operation(scope)  # the connection reset: the database is down
            for _ in range(3):  # then no call waits the pool's full wait (CONNECT_TIMEOUT) for a connection
                started = time.monotonic()
                with pytest.raises(StoreUnavailableError, match="PoolTimeout"):
                    await store.operation(scope)
                assert time.monotonic() - started < FAST
            await proxy.restore()
            await until(answers, timeout=CONNECT_TIMEOUT + MARGIN, what="the store answering again")
        finally:
            await store.aclose()
