"""Attacks on a call's history from outside: real sidecars on real sockets and real stores.

- Two sidecar processes on one PostgreSQL schema, 64 concurrent callers split across them, distinct keyed writes
  mixed with concurrent retries of shared keys (each key's copies sent through both processes): the handler runs
  (one line in a shared log per real execution) at most ``limit`` times, each key at most once, and once every
  call ended the store holds exactly one counted place per execution (nothing leaked, nothing counted twice).
- MCP over HTTP and HTTP/JSON under concurrent load past a limit: exactly ``limit`` run, every refusal is typed
  ``RATE_LIMITED`` with ``retry_after_seconds`` (and ``Retry-After`` on HTTP/JSON).
- A meter's limit hot-reloaded while calls run; a malformed meter is refused at reload and the old one keeps
  counting.
- PostgreSQL's connections terminated while metered calls run: every answer is typed, no handler runs beyond the
  limit, and afterwards the places held are exactly the calls that ran.
- Hostile inputs: conversation ids of other principals, long conversation ids, values a summing meter cannot count.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from sidecar.client import AsyncClient
from sidecar.contract import RETRY_AFTER_SECONDS, ErrorCode, Recovery, ReloadStatus, Status, ToolResult
from sidecar.server.http_json import HttpJsonEndpoint
from sidecar.server.mcp_http import McpEndpoint
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.test_history import (
    Serve,
    basic_registry,
    code,
    limited_message,
    outcomes,
    process_settings,
    process_token,
    serve,
    store_section,
    writes,
)
from tests.support import tools
from tests.support.history import with_meters
from tests.support.mcp import http_client, http_session, typed
from tests.support.reloading import rewrite, until_status
from tests.support.sidecar_process import SidecarProcess, appended
from tests.support.waiting import until

pytestmark = pytest.mark.integration
__all__ = ["postgres", "postgres_dsn", "serve", "store_section"]


def places(dsn: str) -> Counter[str]:
    """How many events of each kind (``call``, ``retry``) the history of the schema of ``dsn`` holds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, count(*) FROM toolbooth_history GROUP BY kind").fetchall()
    return Counter({str(kind): int(count) for kind, count in rows})


def assert_rate_limited(result: ToolResult, limit: int, window: int = 60) -> int:
    """``result`` is a typed ``RATE_LIMITED`` refusal of a call that never ran, saying when to retry; that retry.
    (The retry may exceed the window by the time a call waited for its meter's lock: a call's time is taken before
    it waits, so a call counted earlier may carry a later time than the one it refuses.)"""
    error = result.error
    assert result.status is Status.ERROR and error is not None and error.code is ErrorCode.RATE_LIMITED, result
    assert (error.retryable, error.recovery) == (True, Recovery.RETRY_WITH_BACKOFF)
    assert error.details is not None and set(error.details) == {RETRY_AFTER_SECONDS}, error.details
    retry = error.details[RETRY_AFTER_SECONDS]
    assert type(retry) is int and 1 <= retry <= window + 30, retry
    assert error.retry_after_seconds == retry and error.message == limited_message(limit, retry)
    assert result.meta.attempt == 0 and result.data is None
    return retry


class Processes:
    """Two sidecar processes sharing the PostgreSQL schema ``dsn``, their tools appending to one log."""

    def __init__(self, tmp_path: Path, dsn: str, policies: Path) -> None:
        self.log = tmp_path / "executions.log"
        self.started: list[SidecarProcess] = []
        self.clients: list[AsyncClient] = []
        for name in ("a", "b"):
            config = tmp_path / f"{name}.json"
            config.write_text(json.dumps(process_settings(tmp_path, name, dsn, policies)))
            self.started.append(SidecarProcess(config, tmp_path / f"{name}.sock", tmp_path / f"{name}.err",
                                               self.log))

    async def start(self) -> None:
        await asyncio.gather(*(sidecar.wait_serving() for sidecar in self.started))

    def client(self, which: int, sub: str) -> AsyncClient:
        self.clients.append(client := AsyncClient(self.started[which].target, token=process_token(sub), timeout=60))
        return client

    def executed(self) -> list[str]:
        """The texts of the real executions so far."""
        return [line.split(" ", 1)[1] for line in appended(self.log)]

    async def stop(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients))
        for name, sidecar in zip("ab", self.started, strict=False):
            exit_code = sidecar.stop()
            print(f"--- sidecar {name} (pid {sidecar.process.pid}) exited with {exit_code}:\n{sidecar.output()}")


# --- 1. two processes, keys and their retries, one limit ----------------------------------------------------------


async def test_keyed_writes_and_racing_retries_across_two_processes_never_pass_the_limit(postgres_dsn: str,
                                                                                         tmp_path: Path) -> None:
    limit = 5
    processes = Processes(tmp_path, postgres_dsn, with_meters(tmp_path / "policies", writes(limit)))
    try:
        await processes.start()
        # Each round another principal (a fresh window), 64 callers: distinct keys, and shared keys sent several
        # times each (as many times through each process).
        for round_, (distinct, shared, copies) in enumerate([(32, 8, 4), (0, 16, 4), (0, 8, 8), (60, 1, 4)]):
            sub = f"p{round_}"
            clients = [processes.client(0, sub), processes.client(1, sub)]
            calls: list[tuple[int, str]] = [(n % 2, f"{sub}-d{n}") for n in range(distinct)]
            calls += [(copy % 2, f"{sub}-s{n}") for n in range(shared) for copy in range(copies)]
            results = await asyncio.gather(*(clients[which].execute("append_line", {"text": key},
                                                                    idempotency_key=key) for which, key in calls))
            ran = [text for text in processes.executed() if text.startswith(f"{sub}-")]
            assert len(ran) == limit and len(set(ran)) == len(ran), ran
            by_key: dict[str, list[ToolResult]] = {}
            for (_, key), result in zip(calls, results, strict=True):
                by_key.setdefault(key, []).append(result)
                assert code(result) in {"success", "RATE_LIMITED", "OPERATION_IN_PROGRESS"}, result
                if code(result) == "RATE_LIMITED":
                    assert_rate_limited(result, limit)
                if result.status is Status.SUCCESS:
                    assert result.data is not None and result.data["text"] == key and key in ran, (key, ran)
            # A key ran iff one of its calls succeeded; its other calls were replayed, in progress or limited.
            assert {key for key, each in by_key.items() if any(r.status is Status.SUCCESS for r in each)} == set(ran)
            # Every place given back or kept by a call that ran: one counted place per execution, no retry left.
            held = places(postgres_dsn)
            print(f"round {round_}: {outcomes(results)}, ran {len(ran)}, history {dict(held)}")
            assert held["retry"] == 0, held
            assert held["call"] == len(processes.executed()), (held, processes.executed())
            # The window is full: a new key through either process is limited, a retry of one that ran replayed.
            if len(ran) == limit:
                for client in clients:
                    assert_rate_limited(await client.execute("append_line", {"text": "late"},
                                                             idempotency_key=f"{sub}-late"), limit)
                again = await clients[1].execute("append_line", {"text": ran[0]}, idempotency_key=ran[0])
                assert code(again) == "success" and again.meta.idempotency_replayed, again
    finally:
        await processes.stop()


# --- 2. MCP over HTTP and HTTP/JSON under concurrent load -----------------------------------------------------------


async def test_mcp_and_http_json_callers_at_once_never_pass_the_limit_and_each_refusal_says_when(
        serve: Serve, store_section: dict[str, Any], tmp_path: Path) -> None:
    limit = 5
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(limit)),
                          store=store_section, mcp={"listen": "127.0.0.1:0"}, http_json={"listen": "127.0.0.1:0"})
    mcp = McpEndpoint.open(running.settings, running.pipeline)
    http = HttpJsonEndpoint.open(running.settings, running.pipeline)
    await mcp.start()
    await http.start()
    before = tools.CREATED.value
    token = running.token("web")  # one principal on both transports: one meter
    # Keys: 24 of MCP's, 24 of HTTP/JSON's, and 4 shared ones each sent four times, twice on each transport.
    mcp_keys = [f"m-{n}" for n in range(24)] + [f"s-{n}" for n in range(4) for _ in range(2)]
    http_keys = [f"h-{n}" for n in range(24)] + [f"s-{n}" for n in range(4) for _ in range(2)]
    try:
        async def over_mcp(keys: Sequence[str]) -> list[tuple[ToolResult, bool, Any]]:
            async with http_session(mcp.url, token) as session:
                async def one(key: str) -> tuple[ToolResult, bool, Any]:
                    answer = await session.call_tool("create_note", {"text": key},
                                                     meta=cast(Any, {"toolbooth/idempotency_key": key}))
                    return typed(answer.structured_content), bool(answer.is_error), answer.structured_content

                return list(await asyncio.gather(*(one(key) for key in keys)))

        async def over_http(keys: Sequence[str]) -> list[tuple[ToolResult, str | None]]:
            async with http_client(token) as web:
                answers = await asyncio.gather(*(web.post(http.url, json={"tool": "create_note",
                                                                          "arguments": {"text": key},
                                                                          "idempotency_key": key})
                                                 for key in keys))
            assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
            return [(ToolResult.model_validate(answer.json()), answer.headers.get("Retry-After"))
                    for answer in answers]

        mcp_answers, http_answers = await asyncio.gather(
            asyncio.gather(*(over_mcp(mcp_keys[n::4]) for n in range(4))),
            asyncio.gather(*(over_http(http_keys[n::2]) for n in range(2))))
        results: list[ToolResult] = []
        for result, is_error, structured in (each for answers in mcp_answers for each in answers):
            results.append(result)
            assert is_error is (result.status is not Status.SUCCESS), (is_error, result)
            if code(result) == "RATE_LIMITED":
                retry = assert_rate_limited(result, limit)
                assert structured["error"]["details"] == {RETRY_AFTER_SECONDS: retry}
        for result, retry_after in (each for answers in http_answers for each in answers):
            results.append(result)
            if code(result) == "RATE_LIMITED":
                assert retry_after == str(assert_rate_limited(result, limit))
            else:
                assert retry_after is None, result
        counted = outcomes(results)
        print(f"MCP and HTTP/JSON: {counted}")
        assert set(counted) <= {"success", "RATE_LIMITED", "OPERATION_IN_PROGRESS"}, counted
        assert tools.CREATED.value - before == limit
        ran = {result.data["count"] for result in results if result.status is Status.SUCCESS
               and result.data is not None}
        assert ran == set(range(before + 1, before + limit + 1)), ran
    finally:
        await http.stop()
        await mcp.stop()


# --- 3. meters hot-reloaded while calls run -------------------------------------------------------------------------


def set_meters(policies: Path, meters: dict[str, Any]) -> None:
    data = json.loads((policies / "data.json").read_text())
    data["toolbooth"]["history"]["meters"] = meters
    rewrite(policies / "data.json", json.dumps(data))


async def test_a_meter_reloaded_while_calls_run_counts_on_and_a_malformed_one_is_refused(
        serve_in_background: Any, tmp_path: Path) -> None:
    policies = with_meters(tmp_path / "policies", writes(3))
    target = await serve_in_background(policy={"path": str(policies), "reload_interval_seconds": 0.05},
                                       store={"sqlite_path": str(tmp_path / "toolbooth.db")})
    async with AsyncClient(target, timeout=30) as client:
        first = await client.policy_status()
        before = tools.CREATED.value

        async def burst(tag: str, n: int = 12) -> Counter[str]:
            return outcomes(await asyncio.gather(*(client.execute("create_note", {"text": tag},
                                                                  idempotency_key=f"{tag}-{k}") for k in range(n))))

        assert await burst("a") == {"success": 3, "RATE_LIMITED": 9}
        # A larger limit: the calls already counted stay counted, three more run.
        set_meters(policies, writes(6))
        roomier = await until_status(client, lambda status: status.healthy and status.revision != first.revision)
        assert await burst("b") == {"success": 3, "RATE_LIMITED": 9}
        assert tools.CREATED.value - before == 6
        # Malformed meters are refused at reload, naming the meter and the key; the old one keeps counting.
        for meter, key in (({**writes(6)["writes"], "window_seconds": "60"}, "window_seconds"),
                           ({**writes(6)["writes"], "limit": "6"}, "limit"),
                           ({**writes(6)["writes"], "by": ["principal", "principal"]}, "by"),
                           ({**writes(6)["writes"], "sum": "recipients"}, "sum"),
                           ({**writes(6)["writes"], "side_effects": ["writes"]}, "side_effects"),
                           ({**writes(6)["writes"], "window_seconds": 366 * 86400 + 1}, "window_seconds")):
            set_meters(policies, {"writes": meter})
            named = f"writes.{key}"

            def refused_naming(status: ReloadStatus, named: str = named) -> bool:
                return not status.healthy and named in (status.last_error or "")

            refused = await until_status(client, refused_naming)
            assert refused.revision == roomier.revision, refused
            limited = await client.execute("create_note", {"text": "c"}, idempotency_key=f"c-{key}")
            assert_rate_limited(limited, 6)
            assert limited.meta.policy_revision == roomier.revision
        # A smaller limit while more calls wait: none runs (six are counted already).
        set_meters(policies, writes(2))
        await until_status(client, lambda status: status.healthy and status.revision != roomier.revision)
        assert await burst("d") == {"RATE_LIMITED": 12}
        assert tools.CREATED.value - before == 6


# --- 4. the store's connections killed while metered calls run ------------------------------------------------------


class Terminator:
    """Terminates every other connection to the database of ``dsn`` from a thread of its own: once each time it is
    kicked (paced by the calls under test, not by the clock), until stopped; ``killed`` counts the connections it
    ended."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.killed, self.rounds = dsn, 0, 0
        self._stop, self._kicked = False, asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._kicked.set()
        self._task = asyncio.create_task(self._run())

    def kick(self) -> None:
        self._kicked.set()

    async def _run(self) -> None:
        while True:
            await self._kicked.wait()
            self._kicked.clear()
            if self._stop:
                return
            self.killed += await asyncio.to_thread(self._once)
            self.rounds += 1

    def _once(self) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
        return len(rows)

    async def stop(self) -> None:
        self._stop = True
        self._kicked.set()
        if self._task is not None:
            await self._task


async def test_connections_killed_while_metered_calls_run_give_typed_answers_and_never_pass_the_limit(
        serve: Serve, postgres_dsn: str, tmp_path: Path) -> None:
    limit = 5
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(limit)),
                          store={"postgres_dsn": postgres_dsn})
    client = running.client("kim")
    before = tools.CREATED.value
    terminator = Terminator(postgres_dsn)
    terminator.start()

    async def write(n: int) -> ToolResult:
        try:
            return await client.execute("create_note", {"text": f"t{n}"}, idempotency_key=f"t-{n}")
        finally:
            terminator.kick()

    try:
        answers = await asyncio.gather(*(write(n) for n in range(64)), return_exceptions=True)
    finally:
        await terminator.stop()
    raised = [answer for answer in answers if not isinstance(answer, ToolResult)]
    results = [answer for answer in answers if isinstance(answer, ToolResult)]
    ran = tools.CREATED.value - before
    print(f"killed {terminator.killed} connections in {terminator.rounds} rounds; {outcomes(results)}; ran {ran}; "
          f"raised {raised[:3]}")
    assert not raised, raised
    assert ran <= limit
    for result in results:
        assert code(result) in {"success", "RATE_LIMITED", "SERVICE_UNAVAILABLE", "OPERATION_IN_PROGRESS",
                                "OUTCOME_UNKNOWN", "TIMEOUT"}, result
    assert all(result.meta.attempt == 0 for result in results if result.status is not Status.SUCCESS), results
    # Each call that ran holds its place, none twice; a call that did not run and whose place could not be given
    # back (the store failed) stays counted until it leaves its window: fewer calls may pass, never more.
    held = places(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        twice = conn.execute("SELECT request_id FROM toolbooth_history WHERE kind IN ('call', 'retry') "
                             "GROUP BY scope, request_id HAVING count(*) > 1").fetchall()
    print(f"history after: {dict(held)}")
    assert twice == [] and held["retry"] == 0 and ran <= held["call"], (twice, held)
    # The store is back: another principal's write runs (its own meter), at once or after typed refusals.
    other, attempts = running.client("lee"), iter(range(1000))

    async def recovered() -> bool:
        answer = await other.execute("create_note", {"text": "after"}, idempotency_key=f"after-{next(attempts)}")
        assert code(answer) in {"success", "SERVICE_UNAVAILABLE"}, answer
        return answer.status is Status.SUCCESS

    await until(recovered, timeout=30, what="a write after the faults")


# --- 5. hostile inputs ----------------------------------------------------------------------------------------------


async def test_values_a_summing_meter_cannot_count_and_oversized_conversation_ids_are_refused_counting_nothing(
        serve: Serve, store_section: dict[str, Any], tmp_path: Path) -> None:
    amounts = {"amounts": {"by": ["principal"], "window_seconds": 60, "tools": ["nested"], "sum": "/payload/n",
                           "limit": 10}}
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", amounts), store=store_section)
    agent = running.client("mo")
    for value in ["1", {"n": 1}, True, "NaN", {"$numberDouble": "Infinity"}]:
        refused = await agent.execute("nested", {"payload": {"n": value}})
        assert code(refused) == "INTERNAL_ERROR" and refused.meta.attempt == 0, (value, refused)
        assert refused.error is not None and "meter 'amounts' of the policy sums /payload/n" in refused.error.message
    # A negative amount adds nothing, a list its length, an absent or null one nothing; past the limit: refused.
    for value, expected in ((-1e300, "success"), ([1] * 6, "success"), (None, "success"), (4, "success"),
                            (1, "RATE_LIMITED"), (1e308, "INVALID_ARGUMENT")):
        answer = await agent.execute("nested", {"payload": {"n": value}})
        assert code(answer) == expected, (value, answer)
    # A conversation id over 256 bytes is refused before anything is read or counted.
    long = await agent.execute("nested", {"payload": {"n": 0}}, conversation_id="c" * 257)
    assert code(long) == "INVALID_ARGUMENT" and long.error is not None and long.error.field == "conversation_id"
    assert await running.pipeline.store.driver.fetch(  # type: ignore[attr-defined]
        "SELECT count(*), sum(amount) FROM toolbooth_history WHERE kind = 'call'") == [(4, 10.0)]


async def test_amounts_no_sum_could_hold_are_refused_and_poison_no_meter_without_a_limit(
        serve: Serve, store_section: dict[str, Any], tmp_path: Path) -> None:
    """Found from outside: three calls adding 1e308 each made a meter without a limit sum to infinity (SQLite: every
    later call an untyped gRPC INTERNAL error, its place never given back; PostgreSQL: an overflow, every later call
    SERVICE_UNAVAILABLE) for the rest of the window, for everyone the meter counts together."""
    amounts = {"amounts": {"by": ["tenant"], "window_seconds": 60, "tools": ["nested"], "sum": "/payload/n"}}
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", amounts), store=store_section)
    for _ in range(3):
        refused = await running.client("mo").execute("nested", {"payload": {"n": 1e308}})
        assert code(refused) == "INVALID_ARGUMENT" and refused.error is not None, refused
        assert refused.error.message == ("/payload/n is 1e+308, more than the policy's meter 'amounts' can count "
                                         "(at most 9.0072e+15)")
    for who in ("mo", "ned"):  # the same tenant's meter
        assert code(await running.client(who).execute("nested", {"payload": {"n": 1e15}})) == "success"
    assert await running.pipeline.store.driver.fetch(  # type: ignore[attr-defined]
        "SELECT count(*), sum(amount) FROM toolbooth_history WHERE kind = 'call'") == [(2, 2e15)]
