"""Two sidecar processes sharing one PostgreSQL database (issue 4): 64 concurrent calls with one
idempotency key, split across both, run the handler exactly once; an approval granted through one
is usable through the other, once.

Each sidecar is a real process (``tests.support.sidecar_process``) on its own Unix socket, with JWT
auth and the same database; every real execution of a tool appends one line to a shared file.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import jwt
import psycopg
import pytest

from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, Status, ToolResult
from tests.support.approvals import policies
from tests.support.sidecar_process import SidecarProcess, appended
from tests.support.signing_keys import key_pair
from tests.support.waiting import until

ISSUER, AUDIENCE = "https://issuer.example", "toolbooth"
KEYS = key_pair("RS256")


def token(sub: str, roles: Sequence[str]) -> str:
    claims = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300, "tenant": "acme",
              "roles": list(roles)}
    return jwt.encode(claims, KEYS.private, algorithm="RS256")


class Pair:
    """The two running sidecars, the shared log of executions, and clients for alice (agent) and bob (approver)."""

    def __init__(self, a: SidecarProcess, b: SidecarProcess, log: Path) -> None:
        self.a, self.b, self.log = a, b, log
        self.clients: list[AsyncClient] = []

    def client(self, sidecar: SidecarProcess, sub: str = "alice", roles: Sequence[str] = ("developer",)) -> AsyncClient:
        self.clients.append(client := AsyncClient(sidecar.target, token=token(sub, roles), timeout=10))
        return client

    def approver(self, sidecar: SidecarProcess) -> AsyncClient:
        return self.client(sidecar, "bob", ("approver",))


@pytest.fixture
async def pair(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[Pair]:
    """Two sidecar processes on one fresh PostgreSQL schema; stopped (SIGTERM, then SIGKILL) at teardown,
    their output printed there (pytest shows it when the test failed)."""
    policies(tmp_path / "policies", tools=["append_line_approved"])
    log = tmp_path / "executions.log"
    started: list[SidecarProcess] = []
    try:
        for name in ("a", "b"):
            config = tmp_path / f"{name}.json"
            config.write_text(json.dumps(settings(tmp_path, name, postgres_dsn)))
            started.append(SidecarProcess(config, tmp_path / f"{name}.sock", tmp_path / f"{name}.err", log))
        await asyncio.gather(*(sidecar.wait_serving() for sidecar in started))
        pair = Pair(started[0], started[1], log)
        yield pair
        await asyncio.gather(*(client.close() for client in pair.clients))
    finally:
        for name, sidecar in zip("ab", started, strict=False):
            code = sidecar.stop()
            print(f"--- sidecar {name} (pid {sidecar.process.pid}) exited with {code}:\n{sidecar.output()}")


async def test_writes_through_both_processes_keep_a_chain_each_and_verify(pair: Pair, postgres_dsn: str,
                                                                          tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair.client(pair.a), pair.client(pair.b)
    results = await asyncio.gather(*(client.execute("append_line", {"text": f"w-{n}"}, idempotency_key=f"w-{n}")
                                     for n, client in enumerate([a, b] * 24)))
    assert all(r.status is Status.SUCCESS for r in results), [r.error for r in results if r.error]
    assert Counter(line.split()[1] for line in appended(pair.log)) == Counter(f"w-{n}" for n in range(48))

    def chains() -> list[tuple[int, int]]:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            return conn.execute("SELECT chain_id, count(*) FROM audit GROUP BY chain_id").fetchall()

    # dispatching + outcome per call (the outcomes are queued: written soon after the reply)
    await until(lambda: sum(count for _, count in chains()) == 96, what="every call's two events")
    assert len(chains()) == 2, chains()
    for name in ("a", "b"):  # while both serve, through either's configuration
        assert await asyncio.to_thread(main, ["audit", "verify", "--config", str(tmp_path / f"{name}.json")]) == 0
        assert "audit chain intact: 96 event(s)" in capsys.readouterr().out


def settings(tmp_path: Path, name: str, dsn: str) -> dict[str, Any]:
    return {
        "server": {"listen": [f"unix://{tmp_path / f'{name}.sock'}"], "shutdown_grace_seconds": 2},
        "auth": {"mode": "jwt", "jwt": {"algorithms": ["RS256"], "issuer": ISSUER, "audience": AUDIENCE,
                                        "key": KEYS.public, "leeway_seconds": 0}},
        "policy": {"path": str(tmp_path / "policies"), "reload_interval_seconds": 0},
        "store": {"postgres_dsn": dsn, "sqlite_path": str(tmp_path / f"{name}-unused.db")},
    }


def outcome(result: ToolResult) -> str:
    if result.status is Status.SUCCESS:
        return "replayed" if result.meta.idempotency_replayed else "fresh"
    return result.error.code if result.error is not None else str(result.status)


async def test_64_concurrent_calls_with_one_key_across_two_processes_run_once(pair: Pair) -> None:
    a, b = pair.client(pair.a), pair.client(pair.b)
    results = await asyncio.gather(*(client.execute("append_line", {"text": "once"}, idempotency_key="k-64")
                                     for client in [a, b] * 32))
    outcomes = Counter(outcome(r) for r in results)
    assert outcomes["fresh"] == 1, outcomes
    assert set(outcomes) <= {"fresh", "replayed", ErrorCode.OPERATION_IN_PROGRESS}, outcomes
    assert sum(outcomes.values()) == 64
    lines = appended(pair.log)
    assert len(lines) == 1, lines
    fresh = next(r for r in results if outcome(r) == "fresh")
    assert fresh.data is not None and str(fresh.data["pid"]) == lines[0].split()[0]
    for r in results:
        if r.status is Status.SUCCESS:
            assert r.data == fresh.data
        else:
            assert r.error is not None and r.error.retryable
    # The handler has finished: a retry through either process replays the stored result.
    for client in (a, b):
        retry = await client.execute("append_line", {"text": "once"}, idempotency_key="k-64")
        assert outcome(retry) == "replayed" and retry.data == fresh.data, retry
    assert appended(pair.log) == lines


async def test_an_approval_granted_through_one_process_runs_once_through_the_other(pair: Pair) -> None:
    agent_a, agent_b, approver_a = pair.client(pair.a), pair.client(pair.b), pair.approver(pair.a)
    note = {"text": "approved"}
    asked = await agent_a.execute("append_line_approved", note, idempotency_key="k-ask")
    assert asked.status is Status.APPROVAL_REQUIRED and asked.preview is not None, asked
    preview = asked.preview
    assert (await approver_a.approve(preview.preview_id, preview.preview_hash, comment="ok")).ok
    assert appended(pair.log) == []

    ran = await agent_b.execute("append_line_approved", note, idempotency_key="k-run", approval_id=preview.preview_id)
    assert outcome(ran) == "fresh" and ran.data is not None, ran
    assert ran.data["pid"] == pair.b.process.pid
    assert appended(pair.log) == [f"{pair.b.process.pid} approved"]

    # docs/approvals.md: a used approval is refused ("already used") ...
    again = await agent_a.execute("append_line_approved", note, idempotency_key="k-again",
                                  approval_id=preview.preview_id)
    assert again.error is not None and again.error.code is ErrorCode.PERMISSION_DENIED, again
    assert "already used" in again.error.message and again.meta.attempt == 0
    # ... except a retry with the idempotency key of the call that used it: that call's stored result.
    retry = await agent_a.execute("append_line_approved", note, idempotency_key="k-run",
                                  approval_id=preview.preview_id)
    assert outcome(retry) == "replayed" and retry.data == ran.data, retry
    assert appended(pair.log) == [f"{pair.b.process.pid} approved"]
