#!/usr/bin/env python
"""Keyed writes: calls/s of ExecuteTool on a write tool, each call with its own idempotency key.

    python benchmarks/bench_writes.py [--calls N] [--concurrency 16] [--repeat 3] [--modes sqlite,pg1,pg2]
                                      [--postgres-dsn DSN] [--json]

Every repetition runs each mode on a fresh store:

- ``sqlite``: one sidecar on a new SQLite file (``synchronous=FULL``, the default);
- ``pg1``: one sidecar on a new schema of the PostgreSQL database ``--postgres-dsn``;
- ``pg2``: two sidecars sharing a new schema of that database, the workers split between them;
- ``store-sqlite``, ``store-pg`` (not run by default): the store alone, in this process, without the sidecar:
  each call makes the store writes of a keyed call (claim, dispatching event, result, queued outcome event),
  so the store's own cost shows apart from the rest of the sidecar's.

A sidecar is the real one (``toolbooth serve`` in a child process: dev auth, the bundled policies without their
limit of writes per principal, WARNING logs) with one extra tool, ``bench_write`` (this file's ``--sidecar``
mode): a write (side effect ``internal_reversible``, so a key is required and claimed, and its dispatch audited
before it runs) whose only effect is one line, its key, appended to a file shared by the sidecars.
``--concurrency`` workers each loop over calls with distinct keys; after a warm-up, ``--calls`` calls are timed
(bounded in time too).

After each run the benchmark checks what the guarantees promise, and fails (exit code 1) otherwise:
every call succeeded; every key was executed exactly once (the lines of the effects file); the audit log
holds a dispatching and an outcome event for every call; and ``toolbooth audit verify`` (the CLI, on each
sidecar's configuration) finds the chain intact. It prints calls/s per mode (medians over ``--repeat``),
and the ratio pg2 / pg1 of each repetition and its median. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.plugin import SideEffect, ToolContext, tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_execute as base  # the sibling benchmark: its child processes and readiness probe

TOOL = "bench_write"
EFFECTS_ENV = "BENCH_WRITES_EFFECTS"
MODES = ("sqlite", "pg1", "pg2", "store-sqlite", "store-pg")
STORE_MODES = {"store-sqlite", "store-pg"}
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CALL_TIMEOUT_S = 30.0


# --- the sidecar child ------------------------------------------------------------------------------------


class Key(BaseModel):
    key: str


@tool(name=TOOL, version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=10)
async def bench_write(args: Key, ctx: ToolContext) -> Key:
    """Append the call's key to the effects file (``$BENCH_WRITES_EFFECTS``): one line per real execution."""
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{args.key}\n".encode())
    finally:
        os.close(fd)
    return args


def run_sidecar(config: str) -> None:
    """This file's ``--sidecar`` mode: the real server with the benchmark's write tool added."""
    from sidecar.bootstrap import serve
    from sidecar.cli.common import setup_logging
    from sidecar.config import load_settings
    from sidecar.tools.registry import Registry

    settings = load_settings(Path(config))
    setup_logging(settings.log_level, settings.logging.format)
    asyncio.run(serve(settings, registry=Registry.from_tools([bench_write])))


def sidecar_config(tmp: Path, name: str, store: dict[str, Any]) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps({
        "server": {"listen": [f"unix://{tmp / f'{name}.sock'}"]},
        "auth": {"mode": "dev"},
        "policy": {"path": str(policies if (policies := tmp / "policies").exists() else
                               base.unmetered_policies(policies))},
        "store": {**store, "journal_file": str(tmp / f"{name}.journal")},
        "log_level": "WARNING",
    }))
    return path


# --- PostgreSQL schemas -----------------------------------------------------------------------------------


def new_schema(dsn: str) -> tuple[str, str]:
    """A new schema in the database of ``dsn``: its name and a DSN whose search path starts with it."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = f"bench_writes_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema, make_conninfo(dsn, options=f"-c search_path={schema}")


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --- one run ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    calls: int
    seconds: float
    failures: int
    calls_per_s: float
    cpu_us_per_call: float  # the sidecars' CPU time (all threads) per measured call
    load: float  # 1-minute load average at the end of the run
    problems: list[str]
    busy_cores: float = 0.0  # the whole machine's busy CPU during the measured phase, in cores


def machine_busy_seconds() -> float:
    """CPU seconds the machine's cores have spent busy (neither idle nor waiting for I/O) since boot: the
    client, the sidecars, PostgreSQL and anything else running."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class Driver:
    """``concurrency`` workers (split over ``targets``) making keyed calls, each with a new key; every key used
    and every failure are kept."""

    def __init__(self, targets: list[str], concurrency: int, prefix: str) -> None:
        self.channels = [grpc.aio.insecure_channel(target) for target in targets]
        self.stubs = [pb_grpc.ToolServiceStub(channel) for channel in self.channels]
        self.concurrency, self.prefix = concurrency, prefix
        self.keys: list[str] = []
        self.failures: list[str] = []

    async def phase(self, calls: int, max_seconds: float) -> tuple[int, float]:
        """Make ``calls`` calls (fewer if ``max_seconds`` pass first): how many, and their wall time."""
        budget = [calls]
        started = time.monotonic()
        await asyncio.gather(*(self._worker(self.stubs[i % len(self.stubs)], budget, started + max_seconds)
                               for i in range(self.concurrency)))
        return calls - max(budget[0], 0), time.monotonic() - started

    async def _worker(self, stub: pb_grpc.ToolServiceStub, budget: list[int], deadline: float) -> None:
        while budget[0] > 0 and time.monotonic() < deadline:
            budget[0] -= 1
            await self._call(stub)

    async def _call(self, stub: pb_grpc.ToolServiceStub) -> None:
        key = f"{self.prefix}-{len(self.keys)}"
        self.keys.append(key)
        request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps({"key": key}), idempotency_key=key)
        try:
            reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.failures.append(f"{key}: {exc.code().name} {exc.details()}")
            return
        if reply.status != pb.STATUS_SUCCESS:
            self.failures.append(f"{key}: {base.describe_failure(reply)}")

    async def aclose(self) -> None:
        for channel in self.channels:
            await channel.close()


def cpu_seconds(children: base.Children, names: list[str]) -> float:
    """CPU time (user + system, all threads) the sidecars ``names`` used so far."""
    return sum(base.process_cpu_seconds(children.procs[name].pid) or 0.0 for name in names)


def verify_audit(config: Path) -> str | None:
    """``toolbooth audit verify`` on ``config``: ``None`` if it exits 0, else its output."""
    done = subprocess.run([sys.executable, "-m", "sidecar", "audit", "verify", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, check=False)
    return None if done.returncode == 0 else f"audit verify exited {done.returncode}: {done.stdout}{done.stderr}"


async def count_events(config: Path) -> Counter[str]:
    """The audit events of the store of ``config``, by status."""
    from sidecar.config import load_settings
    from sidecar.state.factory import open_store

    store = await open_store(load_settings(config).store)
    try:
        return Counter(record.event.status for record in await store.audit_records())
    finally:
        await store.aclose()


async def run_mode(mode: str, args: argparse.Namespace, children: base.Children, index: int) -> Run:
    tmp = children.tmp / f"{mode}-{index}"
    tmp.mkdir()
    if mode in STORE_MODES:
        return await run_store(mode, args, tmp)
    effects = tmp / "effects.log"
    os.environ[EFFECTS_ENV] = str(effects)
    schema = None
    if mode == "sqlite":
        stores = [{"sqlite_path": str(tmp / "toolbooth.db")}]
    else:
        schema, dsn = new_schema(args.postgres_dsn)
        stores = [{"postgres_dsn": dsn, "sqlite_path": str(tmp / f"unused-{n}.db"),
                   "pool_max_size": args.pool_size} for n in range(2 if mode == "pg2" else 1)]
    names = [f"{mode}-{index}-{n}" for n in range(len(stores))]
    configs = [sidecar_config(tmp, name, store) for name, store in zip(names, stores, strict=True)]
    try:
        for name, config in zip(names, configs, strict=True):
            children.start(name, [sys.executable, __file__, "--sidecar", str(config)], pdeathsig=True)
        targets = [f"unix://{tmp / f'{name}.sock'}" for name in names]
        for name, target in zip(names, targets, strict=True):
            await base.wait_ready(children, name, target, base.health_serving)
        driver = Driver(targets, args.concurrency, f"{mode}-{index}")
        try:
            await driver.phase(args.warmup, args.max_seconds)
            cpu, busy = cpu_seconds(children, names), machine_busy_seconds()
            measured, seconds = await driver.phase(args.calls, args.max_seconds)
            cpu, busy = cpu_seconds(children, names) - cpu, machine_busy_seconds() - busy
        finally:
            await driver.aclose()
        load, keys, failures = os.getloadavg()[0], driver.keys, driver.failures
        for name in names:
            stop(children, name)
        problems = failures[:5] + [f"{name}: {line}" for name in names for line in children.log_problems(name)[:3]]
        problems += check_effects(effects, keys)
        events = await count_events(configs[0])
        if events["dispatching"] != len(keys) or events["success"] != len(keys):
            problems.append(f"audit events {dict(events)} for {len(keys)} calls")
        problems += [problem for config in configs if (problem := verify_audit(config)) is not None]
    finally:
        for name in names:
            stop(children, name)
        if schema is not None:
            drop_schema(args.postgres_dsn, schema)
    return Run(mode, measured, seconds, len(failures), measured / seconds if seconds else 0.0,
               cpu * 1e6 / measured if measured else 0.0, load, problems, busy / seconds if seconds else 0.0)


async def run_store(mode: str, args: argparse.Namespace, tmp: Path) -> Run:
    """``mode`` ``store-*``: the store writes of ``args.calls`` keyed calls, ``args.concurrency`` at a time, then
    every key checked claimed once and completed, and the chain verified."""
    from sidecar.state import KeyScope
    from sidecar.state.chain import verify_store
    from sidecar.state.factory import open_store
    from sidecar.state.records import AuditEvent

    schema = None
    store_settings: dict[str, Any] = {"sqlite_path": str(tmp / "toolbooth.db"), "journal_file": str(tmp / "j")}
    if mode == "store-pg":
        schema, store_settings["postgres_dsn"] = new_schema(args.postgres_dsn)
    from sidecar.config import StoreSettings

    store = await open_store(StoreSettings.model_validate(store_settings))
    try:
        slots = asyncio.Semaphore(args.concurrency)

        async def call(n: int) -> None:
            scope = KeyScope("bench", "dev", TOOL, f"{mode}-{n}")
            event = AuditEvent(request_id=f"r-{n}", time="2026-01-01T00:00:00.000+00:00", principal_id="dev",
                               tenant="bench", tool=TOOL, tool_version="1.0.0", input_hash="sha256:0",
                               decisions_json="{}", policy_revision="r", idempotency_key=scope.key, call_id=None,
                               conversation_id=None, status="dispatching", error_code=None, duration_ms=0)
            async with slots:
                if not (await store.claim(scope, "hash", f"r-{n}", deadline_at=time.time() + 60)).claimed:
                    raise RuntimeError(f"{scope.key} was not free")
                await store.record_audit(event)
                await store.complete(scope, '{"status": "success"}', request_id=f"r-{n}")
                store.queue_audit(dataclasses.replace(event, status="success"))

        await asyncio.gather(*(call(n) for n in range(args.warmup)))
        cpu, started, busy = time.process_time(), time.monotonic(), machine_busy_seconds()
        await asyncio.gather(*(call(n) for n in range(args.warmup, args.warmup + args.calls)))
        await store.flush_audit()
        seconds, cpu, busy = time.monotonic() - started, time.process_time() - cpu, machine_busy_seconds() - busy
        load = os.getloadavg()[0]
        problems = [f"{n} has no result" for n in range(args.warmup + args.calls)
                    if (record := await store.operation(KeyScope("bench", "dev", TOOL, f"{mode}-{n}"))) is None
                    or record.result_json is None][:5]
        report = await verify_store(store)
        if report.broken is not None or report.checked != 2 * (args.warmup + args.calls):
            problems.append(f"audit chain: {report.checked} links, broken {report.broken}")
    finally:
        await store.aclose()
        if schema is not None:
            drop_schema(args.postgres_dsn, schema)
    return Run(mode, args.calls, seconds, 0, args.calls / seconds, cpu * 1e6 / args.calls, load, problems,
               busy / seconds)


def stop(children: base.Children, name: str) -> None:
    """SIGTERM the child ``name`` (if started and running) and wait for it: it writes what it queued first."""
    proc = children.procs.get(name)
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=base.STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def check_effects(effects: Path, keys: list[str]) -> list[str]:
    """Each of ``keys`` executed exactly once (one line each in the effects file), and nothing else."""
    lines = Counter(effects.read_text().splitlines() if effects.exists() else [])
    twice = [key for key, count in lines.items() if count > 1]
    missing = [key for key in keys if key not in lines]
    stray = set(lines) - set(keys)
    problems = []
    if twice:
        problems.append(f"{len(twice)} key(s) executed more than once, e.g. {twice[:3]}")
    if missing:
        problems.append(f"{len(missing)} key(s) never executed, e.g. {missing[:3]}")
    if stray:
        problems.append(f"{len(stray)} execution(s) of unknown keys")
    return problems


# --- report -----------------------------------------------------------------------------------------------


def summarize(runs: list[Run], modes: list[str], repeat: int) -> dict[str, Any]:
    by_mode = {mode: [run for run in runs if run.mode == mode] for mode in modes}
    summary: dict[str, Any] = {
        mode: {"median_calls_per_s": statistics.median(r.calls_per_s for r in rs),
               "median_cpu_us_per_call": statistics.median(r.cpu_us_per_call for r in rs),
               "median_busy_cores": statistics.median(r.busy_cores for r in rs),
               "runs": [round(r.calls_per_s, 1) for r in rs], "loads": [round(r.load, 2) for r in rs]}
        for mode, rs in by_mode.items() if rs}
    if by_mode.get("pg1") and by_mode.get("pg2"):
        ratios = [two.calls_per_s / one.calls_per_s for one, two in zip(by_mode["pg1"], by_mode["pg2"], strict=True)]
        summary["ratio_pg2_pg1"] = {"median": statistics.median(ratios), "runs": [round(r, 2) for r in ratios]}
    summary["repeat"] = repeat
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"{'mode':<13} {'calls/s (median)':>17} {'CPU µs/call':>12} {'busy cores':>10}  runs (load average)"]
    for mode in MODES:
        if mode in summary:
            row = summary[mode]
            runs = ", ".join(f"{value} ({load})" for value, load in zip(row["runs"], row["loads"], strict=True))
            rate, cpu, busy = row["median_calls_per_s"], row["median_cpu_us_per_call"], row["median_busy_cores"]
            lines.append(f"{mode:<13} {rate:>17.1f} {cpu:>12.0f} {busy:>10.2f}  {runs}")
    if "ratio_pg2_pg1" in summary:
        ratio = summary["ratio_pg2_pg1"]
        lines.append(f"pg2/pg1       {ratio['median']:>17.2f} {'':>12} {'':>10}  {', '.join(map(str, ratio['runs']))}")
    lines.append(f"busy cores: the whole machine's CPU in use while measuring, of {os.cpu_count()}: what a second "
                 "sidecar can add is at most what is left")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per run (default 3000)")
    parser.add_argument("--warmup", type=int, default=300, help="warm-up calls per run (default 300)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (default 3)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time bound of a run (default 60)")
    parser.add_argument("--modes", default="sqlite,pg1,pg2",
                        help=f"comma-separated, of {', '.join(MODES)} (default sqlite,pg1,pg2)")
    parser.add_argument("--postgres-dsn", default=os.environ.get("TOOLBOOTH_TEST_POSTGRES_DSN", DEFAULT_DSN))
    parser.add_argument("--pool-size", type=int, default=10, help="store.pool_max_size of each sidecar")
    parser.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    if args.calls < 1 or args.concurrency < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--calls, --concurrency and --repeat must be at least 1, --warmup at least 0")
    args.modes = modes
    return args


async def bench(args: argparse.Namespace, children: base.Children) -> list[Run]:
    runs = []
    for index in range(args.repeat):
        for mode in args.modes:
            run = await run_mode(mode, args, children, index)
            problems = "".join(f"; {problem}" for problem in run.problems)
            print(f"{mode} #{index + 1}: {run.calls_per_s:.1f} calls/s ({run.calls} calls in {run.seconds:.2f} s, "
                  f"{run.cpu_us_per_call:.0f} µs CPU/call, machine {run.busy_cores:.2f} cores busy, "
                  f"load {run.load:.2f}){problems}", file=sys.stderr)
            runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--sidecar":
        run_sidecar(sys.argv[2])
        return 0
    args = parse_args(argv)
    base.sidecar_env_clean()
    children = base.Children()
    try:
        runs = asyncio.run(bench(args, children))
    finally:
        children.close()
    summary = summarize(runs, args.modes, args.repeat)
    print(format_summary(summary), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({"summary": summary, "runs": [asdict(run) for run in runs]}, indent=2))
    problems = [f"{run.mode}: {problem}" for run in runs for problem in run.problems]
    for problem in problems:
        print(f"FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
