#!/usr/bin/env python
"""Soak: the sidecar under sustained mixed load at half of its peak, with a policy reload every minute.

    python benchmarks/soak.py [--minutes 10] [--postgres] [--json]

In one run this script

1. starts ``toolbooth serve`` (helpers of ``bench_execute``) on the default configuration except for where
   it keeps things: a Unix socket, a fresh SQLite file (or, with ``--postgres``, a fresh database on the
   PostgreSQL at ``$TOOLBOOTH_TEST_POSTGRES_DSN``, default ``postgresql://postgres@127.0.0.1:5432/test``,
   reached through a TCP proxy this script controls), a copy of the bundled policies, dev auth, WARNING
   logs, and no cap on the previews one principal holds; plus the plugin ``soak`` (``soak_tools.py``: a keyed
   write that records every real execution);
2. measures the peak: ``--concurrency`` calls in flight, closed loop, for ``--peak-seconds``;
3. sends calls at ``--load-fraction`` (0.5) of that rate, paced (open loop), for ``--minutes``: 70% reads
   (``calculate``), 20% keyed writes (``soak_write``, a new key each; one in ten a retry of a write that has
   finished, which must replay), 10% calls that need approval (``create_task_preview``, then ``create_task``
   of that preview: ``APPROVAL_REQUIRED``, the expected typed result, timed alone); it rewrites the policy
   data every ``--bucket-seconds`` (60) so hot reload fires;
4. with ``--postgres``, cuts the database off halfway (the proxy drops every connection and refuses new
   ones, as a restarting server does) for ``--outage-seconds``, then lets it back; or, with
   ``--stop-command`` and ``--start-command``, really stops the server with the one, waits
   ``--outage-seconds`` and starts it again with the other (then the sidecar reaches the server directly,
   and the server is started again whatever happens to the run);
5. stops the sidecar (SIGTERM) and runs ``toolbooth audit verify`` and ``toolbooth audit export`` on its store.

It reports, per bucket (a minute): calls/s, p50 and p99, RSS; the sidecar's RSS at the end of the paced phase
against its idle RSS (read ``--idle-seconds`` after it is SERVING, before any call), as issue 27's target row
(``target_rows``: at most ``TARGET_RSS_TO_IDLE`` times); and the verdicts: no error other than the
expected typed ones (``SERVICE_UNAVAILABLE`` counts as expected only from the cut until 10 s after the
database is back), RSS growth from the end of the first bucket (the warm-up) to the end < 10%, p99 of the
last bucket within 20% of the first's (the first after the warm-up when there are three or more), every
reload seen (a new policy revision in the results), every fresh write executed exactly once and audited
as a success, the chain verified; with ``--postgres`` also that the outage's refused calls answered within
``FAIL_FAST_MS`` (p99) and that writes were back at their rate, without a failure for ``RECOVERED_FOR_S``
seconds, within 10 s of the database. Exit code 1
when a verdict fails. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import bench_execute as be  # noqa: E402
import soak_tools  # noqa: E402

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb  # noqa: E402
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc  # noqa: E402

POSTGRES_DSN = os.environ.get("TOOLBOOTH_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RECOVERY_GRACE_S = 10.0  # after the database is back, SERVICE_UNAVAILABLE is still expected this long
MAX_RSS_GROWTH = 0.10
MAX_P99_DRIFT = 0.20
SAMPLES = 5
STORE_SHARE = 0.3  # of the calls, those that write to the store before they answer (writes, approvals)
RECOVERED_FOR_S = 5  # seconds in a row at the rate, with no failure, to count as recovered
FAIL_FAST_MS = 1000.0  # a call refused for the outage answers within this (p99)
TARGET_RSS_TO_IDLE = 1.5  # RSS at the end of the paced phase / idle RSS (issue 27)
_CONVERSATION = "soak"
_TASK = {"title": "Soak", "project_id": "proj-quickstart", "assignee_id": "u-dev"}  # the tasks plugin's sample


# --- the database outage: a proxy in a child process ------------------------------------------------------


async def _proxy_main(port: int, upstream: tuple[str, int]) -> None:
    """Forward 127.0.0.1:``port`` to ``upstream``; SIGUSR1 cuts (every connection dropped, new ones refused),
    SIGUSR2 restores."""
    links: set[asyncio.StreamWriter] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        links.update((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        links.difference_update((writer, up_writer))

    server: asyncio.Server | None = await asyncio.start_server(accept, "127.0.0.1", port)
    loop, stop = asyncio.get_running_loop(), asyncio.Event()

    def cut() -> None:
        nonlocal server
        if server is not None:
            server.close()
            server = None
        for writer in list(links):
            with contextlib.suppress(OSError):
                writer.transport.abort()  # RST, as a killed server's connections end
        links.clear()

    async def restore() -> None:
        nonlocal server
        if server is None:
            server = await asyncio.start_server(accept, "127.0.0.1", port)

    loop.add_signal_handler(signal.SIGUSR1, cut)
    loop.add_signal_handler(signal.SIGUSR2, lambda: asyncio.ensure_future(restore()))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


class ProxyCut:
    """The outage as the proxy makes it: every connection dropped and new ones refused, until restored."""

    def __init__(self, proxy: subprocess.Popen[bytes]) -> None:
        self._proxy = proxy

    async def cut(self) -> None:
        self._proxy.send_signal(signal.SIGUSR1)

    async def restore(self) -> None:
        self._proxy.send_signal(signal.SIGUSR2)

    async def ensure_up(self) -> None:
        """Nothing to do: the proxy dies with the run."""


class ServerRestart:
    """The outage as a restart of the database server: ``stop`` and ``start`` are shell commands."""

    def __init__(self, stop: str, start: str) -> None:
        self._stop, self._start, self._down = stop, start, False

    async def cut(self) -> None:
        self._down = True
        await _shell(self._stop)

    async def restore(self) -> None:
        await _shell(self._start)
        self._down = False

    async def ensure_up(self) -> None:
        """Start the server again if the run stopped it and ended before it could (an error, Ctrl-C)."""
        if self._down:
            be.progress("starting the database server again")
            await self.restore()


Outage = ProxyCut | ServerRestart


async def _shell(command: str) -> None:
    process = await asyncio.create_subprocess_shell(command, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{command!r} exited with {process.returncode}: {output.decode(errors='replace')[-500:]}")


# --- calls ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: float  # monotonic, since the soak began
    latency: float
    kind: str  # read, write, retry, approval
    result: str  # ok, approval_required, SERVICE_UNAVAILABLE, ... or "gRPC CODE"
    revision: str = ""
    key: str = ""


class Mix:
    """The calls of the soak, one after another: which kind, with which arguments and key."""

    def __init__(self, stub: pb_grpc.ToolServiceStub) -> None:
        self.stub, self.rng, self.count = stub, random.Random(7), 0
        self.done_keys: list[str] = []  # fresh writes that finished, the newest last

    def next(self) -> tuple[str, pb.ExecuteToolRequest]:
        self.count += 1
        draw = self.rng.random()
        if draw < 0.7:
            operands = [self.count % 50, 1]
            return "read", pb.ExecuteToolRequest(tool="calculate", arguments_json=json.dumps(
                {"operation": "add", "operands": operands}))
        if draw < 0.9:
            if self.done_keys and self.count % 10 == 0:  # a retry of a write that has finished: a replay
                key, kind = self.done_keys[-1], "retry"
            else:
                key, kind = f"w-{uuid.uuid4().hex}", "write"
            return kind, pb.ExecuteToolRequest(tool="soak_write", arguments_json=json.dumps({"key": key}),
                                               idempotency_key=key)
        return "approval", pb.ExecuteToolRequest(tool="create_task_preview", arguments_json=json.dumps(_TASK),
                                                 conversation_id=_CONVERSATION)

    async def call(self, started: float) -> Outcome:
        kind, request = self.next()
        sent = time.monotonic()
        try:
            reply = await self.stub.ExecuteTool(request, timeout=30)
            if kind == "approval" and reply.status == pb.STATUS_SUCCESS:  # the preview; then the call it previews
                preview = json.loads(reply.data_json)["preview_id"]
                request = pb.ExecuteToolRequest(tool="create_task", arguments_json=json.dumps({"preview_id": preview}),
                                                conversation_id=_CONVERSATION, idempotency_key=uuid.uuid4().hex)
                sent = time.monotonic()
                reply = await self.stub.ExecuteTool(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return Outcome(sent - started, time.monotonic() - sent, kind, f"gRPC {exc.code().name}")
        latency = time.monotonic() - sent
        outcome = classify(kind, reply)
        if outcome == "fresh":
            self.done_keys.append(request.idempotency_key)
            del self.done_keys[:-100]
        return Outcome(sent - started, latency, kind, outcome, reply.meta.policy_revision,
                       request.idempotency_key if kind in ("write", "retry") else "")


def classify(kind: str, reply: pb.ToolResult) -> str:
    if reply.status == pb.STATUS_APPROVAL_REQUIRED:
        return "approval_required"
    if reply.status == pb.STATUS_SUCCESS:
        if kind == "retry":
            return "ok" if reply.meta.idempotency_replayed else "retry not replayed"
        return "fresh" if kind == "write" and not reply.meta.idempotency_replayed else "ok"
    return pb.ErrorCode.Name(reply.error.code).removeprefix("ERROR_CODE_")


def expected(outcome: Outcome, outage: tuple[float, float] | None) -> bool:
    """A result the soak expects: a success, an approval call held, or, around the outage, SERVICE_UNAVAILABLE."""
    if outcome.result in ("ok", "fresh"):
        return True
    if outcome.result == "approval_required":
        return outcome.kind == "approval"
    if outcome.result == "SERVICE_UNAVAILABLE" and outage is not None:
        return outage[0] <= outcome.sent + outcome.latency and outcome.sent <= outage[1] + RECOVERY_GRACE_S
    return False


async def closed_loop(mix: Mix, concurrency: int, seconds: float) -> float:
    """Calls/s with ``concurrency`` calls in flight for ``seconds``."""
    started = time.monotonic()
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.monotonic() - started < seconds:
            await mix.call(started)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.monotonic() - started)


@dataclass
class Soak:
    """What the paced phase saw."""

    outcomes: list[Outcome] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds, bytes)
    reloads: int = 0
    behind: int = 0  # calls not sent on time: every slot in flight
    outage: tuple[float, float] | None = None
    idle_rss: int | None = None  # bytes, after start and before any call
    end_rss: int | None = None  # bytes, once the last paced call has ended


def rss_bytes(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def rewrite_policy(policies: Path, generation: int) -> None:
    """A harmless change to the policy data: a new revision, the same decisions."""
    path = policies / "data.json"
    data = json.loads(path.read_text())
    data["toolbooth"]["soak_generation"] = generation
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


async def paced(mix: Mix, rate: float, args: argparse.Namespace, pid: int, policies: Path,
                outage: Outage | None) -> Soak:
    soak = Soak()
    duration = args.minutes * 60
    started = time.monotonic()
    in_flight: set[asyncio.Task[None]] = set()

    async def one() -> None:
        soak.outcomes.append(await mix.call(started))

    async def background() -> None:
        generation, next_reload, next_rss = 0, args.bucket_seconds, 0.0
        outage_at = duration / 2 if outage is not None else None
        while (now := time.monotonic() - started) < duration:
            if now >= next_rss:
                if (rss := rss_bytes(pid)) is not None:
                    soak.rss.append((now, rss))
                next_rss += 1.0
            if now >= next_reload:
                generation += 1
                rewrite_policy(policies, generation)
                soak.reloads += 1
                next_reload += args.bucket_seconds
            if outage_at is not None and outage is not None and now >= outage_at:
                outage_at = None
                cut = time.monotonic() - started
                await outage.cut()
                be.progress(f"  database cut at {cut:.1f} s (down at {time.monotonic() - started:.1f} s)")
                await asyncio.sleep(args.outage_seconds)
                await outage.restore()
                soak.outage = (cut, time.monotonic() - started)
                be.progress(f"  database back at {soak.outage[1]:.1f} s")
            await asyncio.sleep(0.05)

    side = asyncio.create_task(background())
    interval, slot = 1.0 / rate, 0
    while (now := time.monotonic() - started) < duration:
        due = slot * interval
        if due > now:
            await asyncio.sleep(due - now)
        slot += 1
        if len(in_flight) >= args.max_in_flight:
            soak.behind += 1
            continue
        task = asyncio.create_task(one())
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await side
    await asyncio.gather(*in_flight)
    soak.end_rss = rss_bytes(pid)
    return soak


# --- the report -------------------------------------------------------------------------------------------


def buckets(soak: Soak, seconds: float, total: float) -> list[dict[str, Any]]:
    rows = []
    for start in range(0, int(total), int(seconds)):
        inside = sorted(o.latency for o in soak.outcomes if start <= o.sent < start + seconds)
        rss = [r for t, r in soak.rss if start <= t < start + seconds]
        rows.append({"from_s": start, "calls": len(inside), "calls_per_s": len(inside) / seconds,
                     "p50_ms": be.percentile(inside, 50) * 1000, "p99_ms": be.percentile(inside, 99) * 1000,
                     "rss_mb": rss[-1] / 2**20 if rss else None})
    return rows


def recovery_seconds(soak: Soak, rate: float) -> float | None:
    """From the database coming back to the first of ``RECOVERED_FOR_S`` seconds in a row in which the calls that
    need it (writes, approvals) sent then all succeed, at 80% of their share of ``rate`` or more."""
    if soak.outage is None:
        return None
    back, share = soak.outage[1], STORE_SHARE * rate
    good: collections.Counter[int] = collections.Counter()
    bad: collections.Counter[int] = collections.Counter()
    for o in soak.outcomes:
        if o.sent >= back and o.kind != "read":
            (good if o.result in ("ok", "fresh", "approval_required") else bad)[int(o.sent - back)] += 1
    last = int(max([*good, *bad], default=0))
    for second in range(last - RECOVERED_FOR_S + 2):
        window = range(second, second + RECOVERED_FOR_S)
        if all(good[s] >= 0.8 * share and not bad[s] for s in window):
            return float(second)
    return None


def store_check(config: Path, fresh: set[str]) -> dict[str, Any]:
    """``audit verify``, and the outcome events of the soak's writes in the audit log (``audit export``)."""
    run = [sys.executable, "-m", "sidecar", "audit"]
    verify = subprocess.run([*run, "verify", "--config", str(config)], capture_output=True, text=True, timeout=600)
    export = subprocess.run([*run, "export", "--config", str(config)], capture_output=True, text=True, timeout=600)
    audited: collections.Counter[str] = collections.Counter()
    for line in export.stdout.splitlines():
        event = json.loads(line)
        if event.get("tool") == "soak_write" and event.get("status") == "success":
            audited[event.get("idempotency_key") or ""] += 1
    return {"verify_exit": verify.returncode, "verify_output": (verify.stdout + verify.stderr).strip()[-500:],
            "export_exit": export.returncode, "fresh_writes_audited": len(fresh & set(audited)),
            "fresh_writes_not_audited": len(fresh - set(audited))}


def report(soak: Soak, args: argparse.Namespace, peak: float, rate: float, executions: Path,
           store: dict[str, Any], stopped: int) -> dict[str, Any]:
    total = args.minutes * 60
    rows = buckets(soak, args.bucket_seconds, total)
    unexpected = collections.Counter(f"{o.kind}: {o.result}" for o in soak.outcomes if not expected(o, soak.outage))
    typed = collections.Counter(o.result for o in soak.outcomes if o.result not in ("ok", "fresh"))
    fresh = [o.key for o in soak.outcomes if o.result == "fresh"]
    ran = collections.Counter(executions.read_text().split()) if executions.exists() else collections.Counter()
    first = rows[1] if len(rows) >= 3 else rows[0]
    warm = [r for t, r in soak.rss if t >= args.bucket_seconds] or [r for _, r in soak.rss]
    growth = (warm[-1] - warm[0]) / warm[0] if warm else float("nan")
    drift = abs(rows[-1]["p99_ms"] - first["p99_ms"]) / first["p99_ms"] if first["p99_ms"] else float("nan")
    revisions = {o.revision for o in soak.outcomes if o.revision}
    to_idle = soak.end_rss / soak.idle_rss if soak.end_rss is not None and soak.idle_rss else None
    verdicts = {
        "no unexpected errors": not unexpected,
        f"RSS growth after warm-up < {MAX_RSS_GROWTH:.0%}": growth < MAX_RSS_GROWTH,
        f"p99 last vs first within {MAX_P99_DRIFT:.0%}": drift <= MAX_P99_DRIFT,
        "every reload seen": len(revisions) >= soak.reloads + 1 or soak.reloads == 0,
        "fresh writes ran exactly once": all(ran[key] == 1 for key in fresh) and sum(ran.values()) == len(set(ran))
        and set(ran) <= set(fresh) | {o.key for o in soak.outcomes if o.result != "fresh"},
        "fresh writes audited": store["fresh_writes_not_audited"] == 0,
        "audit chain verified": store["verify_exit"] == 0,
        "sidecar stopped cleanly": stopped == 0,
    }
    result: dict[str, Any] = {
        "minutes": args.minutes, "store": "postgres" if args.postgres else "sqlite", "peak_calls_per_s": peak,
        "target_calls_per_s": rate, "calls": len(soak.outcomes), "behind": soak.behind, "buckets": rows,
        "typed_results": dict(typed), "unexpected": dict(unexpected.most_common(SAMPLES)),
        "load_fraction": args.load_fraction, "idle_rss_mb": _mb(soak.idle_rss), "end_rss_mb": _mb(soak.end_rss),
        "rss_to_idle": to_idle, "rss_growth": growth, "p99_drift": drift, "reloads": soak.reloads,
        "revisions_seen": len(revisions), "fresh_writes": len(fresh), "executions": sum(ran.values()),
        "store_check": store, "load_average": os.getloadavg(), "verdicts": verdicts,
    }
    if soak.outage is not None:
        during = sorted(o.latency for o in soak.outcomes if o.result == "SERVICE_UNAVAILABLE")
        result["outage"] = {"from_s": soak.outage[0], "to_s": soak.outage[1], "service_unavailable": len(during),
                            "their_p99_ms": be.percentile(during, 99) * 1000 if during else None,
                            "recovered_after_s": recovery_seconds(soak, rate)}
        recovered, p99 = result["outage"]["recovered_after_s"], result["outage"]["their_p99_ms"]
        verdicts[f"outage calls fail fast (p99 <= {FAIL_FAST_MS:.0f} ms)"] = p99 is not None and p99 <= FAIL_FAST_MS
        verdicts["throughput back within 10 s"] = recovered is not None and recovered <= 10
    result["target_rows"] = [dict(zip(be.TARGET_HEADER, row, strict=True)) for row in target_rows(result)]
    return result


def _mb(rss: int | None) -> float | None:
    return None if rss is None else rss / 2**20


def target_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Issue 27's target of the soak's report (its JSON document): RSS at the end of the paced phase against idle RSS,
    as (target, figure, ratio, wanted, met)."""
    fraction = result["load_fraction"]
    load = "half of peak" if fraction == 0.5 else f"{fraction:g} of peak"
    idle, end, ratio = result["idle_rss_mb"], result["end_rss_mb"], result["rss_to_idle"]
    figure = "n/a" if idle is None or end is None else f"{end:.1f} MB (idle {idle:.1f})"
    return [(f"RSS after {result['minutes']:g} min at {load} / idle", figure,
             "n/a" if ratio is None else f"{ratio:.2f}", f"<= {TARGET_RSS_TO_IDLE}",
             be.met(ratio is not None and ratio <= TARGET_RSS_TO_IDLE))]


def print_report(result: dict[str, Any], out: Any) -> None:
    print(f"\nsoak {result['minutes']} min on {result['store']}: peak {result['peak_calls_per_s']:.0f} calls/s, "
          f"paced at {result['target_calls_per_s']:.0f}; {result['calls']} calls ({result['behind']} not sent on "
          f"time); load average {' '.join(f'{x:.2f}' for x in result['load_average'])}", file=out)
    print(f"{'from':>6}{'calls/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'RSS MB':>9}", file=out)
    for row in result["buckets"]:
        rss = "n/a" if row["rss_mb"] is None else f"{row['rss_mb']:.1f}"
        print(f"{row['from_s']:>5}s{row['calls_per_s']:>9.0f}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{rss:>9}",
              file=out)
    print(f"typed results: {result['typed_results']}; unexpected: {result['unexpected'] or 'none'}", file=out)
    print(f"RSS growth {result['rss_growth']:+.1%}, p99 drift {result['p99_drift']:.1%}, reloads "
          f"{result['reloads']} ({result['revisions_seen']} revisions seen), fresh writes {result['fresh_writes']}, "
          f"executions {result['executions']}; audit verify: {result['store_check']['verify_output'].splitlines()[:1]}",
          file=out)
    if "outage" in result:
        outage = result["outage"]
        p99 = "n/a" if outage["their_p99_ms"] is None else f"{outage['their_p99_ms']:.0f} ms"
        print(f"outage {outage['from_s']:.1f}-{outage['to_s']:.1f} s: {outage['service_unavailable']} "
              f"SERVICE_UNAVAILABLE, p99 {p99}; writes back at their rate after {outage['recovered_after_s']} s",
              file=out)
    problems = result.get("sidecar_log_problems", [])
    print(f"sidecar log: {len(problems)} error line(s)" + "".join(f"\n  {line[:300]}" for line in problems[:SAMPLES]),
          file=out)
    for name, held in result["verdicts"].items():
        print(f"  {'PASS' if held else 'FAIL'}  {name}", file=out)
    print("\n" + be.format_rows([be.TARGET_HEADER, *target_rows(result)]), file=out)


# --- main -------------------------------------------------------------------------------------------------


def install_plugin(site: Path) -> None:
    """``soak_tools`` as the installed plugin ``soak`` (a minimal distribution on the sidecar's ``PYTHONPATH``)."""
    info = site / "toolbooth_soak-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toolbooth-soak\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[toolbooth.tools]\nsoak = soak_tools:PLUGIN\n")


def configure(tmp: Path, args: argparse.Namespace, database: str | None) -> tuple[Path, Path]:
    policies = be.unmetered_policies(tmp / "policies")
    config: dict[str, Any] = {
        "server": {"listen": [f"unix://{tmp / 'sidecar.sock'}"]},
        "auth": {"mode": "dev"},
        "policy": {"path": str(policies)},
        "store": {"sqlite_path": str(tmp / "state" / "toolbooth.db")},
        "log_level": "WARNING",
        # Its one principal holds every preview it makes, undecided until they expire (15 min): more than the
        # default cap of pending previews, whose refusal is tested on its own (tests/adversarial/test_pending_flood.py).
        "limits": {"max_pending_previews_per_principal": 1_000_000},
    }
    if database is not None:
        config["store"]["postgres_dsn"] = database
    path = tmp / "sidecar.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path, policies


@contextlib.contextmanager
def postgres_database(enabled: bool) -> Any:
    """A fresh database on the PostgreSQL server (dropped after), or ``None``."""
    if not enabled:
        yield None
        return
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    name = f"toolbooth_soak_{os.getpid()}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = conninfo_to_dict(POSTGRES_DSN)
    try:
        yield parts, name
    finally:
        with psycopg.connect(POSTGRES_DSN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def soak(args: argparse.Namespace, children: be.Children, database: Any) -> dict[str, Any]:
    tmp = children.tmp
    site = tmp / "site"
    install_plugin(site)
    executions = tmp / "executions.log"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), str(BENCHMARKS), os.environ.get("PYTHONPATH", "")])
    os.environ[soak_tools.EXECUTIONS_ENV] = str(executions)
    outage: Outage | None = None
    dsn = None
    if database is not None:
        parts, name = database
        host, port, user = parts.get("host", "127.0.0.1"), int(parts.get("port", 5432)), parts.get("user", "postgres")
        if args.stop_command:
            outage = ServerRestart(args.stop_command, args.start_command)
        else:
            port, upstream = be.free_port(), f"{host}:{port}"
            host = "127.0.0.1"
            outage = ProxyCut(children.start("proxy", [sys.executable, __file__, "--proxy", str(port), upstream],
                                             pdeathsig=True))
        dsn = f"postgresql://{user}@{host}:{port}/{name}"
    try:
        return await _soak(args, children, outage, dsn, executions)
    finally:
        if outage is not None:
            await outage.ensure_up()


async def _soak(args: argparse.Namespace, children: be.Children, outage: Outage | None, dsn: str | None,
                executions: Path) -> dict[str, Any]:
    tmp = children.tmp
    config, policies = configure(tmp, args, dsn)
    sidecar = children.start("sidecar", [sys.executable, "-m", "sidecar", "serve", "--config", str(config)],
                             pdeathsig=True)
    target = f"unix://{tmp / 'sidecar.sock'}"
    await be.wait_ready(children, "sidecar", target, be.health_serving)
    await asyncio.sleep(args.idle_seconds)
    idle_rss = rss_bytes(sidecar.pid)
    be.progress("idle RSS " + ("n/a" if idle_rss is None else f"{idle_rss / 2**20:.1f} MB"))
    async with grpc.aio.insecure_channel(target) as channel:
        mix = Mix(pb_grpc.ToolServiceStub(channel))
        peak = await closed_loop(mix, args.concurrency, args.peak_seconds)
        executions.write_text("")  # count the paced phase's executions only (the peak's have all ended)
        rate = peak * args.load_fraction
        be.progress(f"peak {peak:.0f} calls/s at {args.concurrency} in flight; pacing at {rate:.0f} calls/s for "
                    f"{args.minutes} min")
        mix.count = 0
        result = await paced(mix, rate, args, sidecar.pid, policies, outage)
    result.idle_rss = idle_rss
    sidecar.send_signal(signal.SIGTERM)
    stopped = await asyncio.to_thread(sidecar.wait, 120)
    fresh = {o.key for o in result.outcomes if o.result == "fresh"}
    store = await asyncio.to_thread(store_check, config, fresh)
    outcome = report(result, args, peak, rate, executions, store, stopped)
    outcome["sidecar_log_problems"] = children.log_problems("sidecar")
    return outcome


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the paced phase (default: 10)")
    parser.add_argument("--bucket-seconds", type=float, default=60.0,
                        help="one report row, and one policy reload, per this many seconds (default: 60)")
    parser.add_argument("--load-fraction", type=float, default=0.5, help="of the peak rate (default: 0.5)")
    parser.add_argument("--peak-seconds", type=float, default=10.0, help="the peak measurement (default: 10)")
    parser.add_argument("--idle-seconds", type=float, default=2.0,
                        help="once SERVING, idle this long before reading idle RSS (default: 2)")
    parser.add_argument("--concurrency", type=int, default=16, help="in flight while measuring the peak (16)")
    parser.add_argument("--max-in-flight", type=int, default=256, help="paced calls in flight at most (256)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL, cut off once halfway")
    parser.add_argument("--outage-seconds", type=float, default=10.0, help="how long the database is cut off")
    parser.add_argument("--stop-command", help="with --postgres: a shell command that stops the database server, "
                        "run halfway instead of the proxy's cut (e.g. 'pg_ctlcluster 15 main stop')")
    parser.add_argument("--start-command", help="with --stop-command: the command that starts it again")
    parser.add_argument("--json", action="store_true", help="a JSON document on stdout (the report on stderr)")
    parser.add_argument("--proxy", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.proxy is None and (args.minutes <= 0 or args.bucket_seconds <= 0 or not 0 < args.load_fraction <= 1
                               or args.peak_seconds <= 0 or args.concurrency < 1 or args.max_in_flight < 1
                               or args.idle_seconds < 0):
        parser.error("--minutes, --bucket-seconds, --peak-seconds must be positive, --load-fraction in (0, 1], "
                     "--concurrency and --max-in-flight at least 1, --idle-seconds at least 0")
    if (args.stop_command is None) != (args.start_command is None) or (args.stop_command and not args.postgres):
        parser.error("--stop-command and --start-command go together, and with --postgres")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.proxy is not None:
        be._die_with_parent()
        host, _, port = args.proxy[1].rpartition(":")
        asyncio.run(_proxy_main(int(args.proxy[0]), (host, int(port))))
        return 0
    signal.signal(signal.SIGTERM, be.raise_keyboard_interrupt)
    be.sidecar_env_clean()
    children = be.Children()
    try:
        with postgres_database(args.postgres) as database:
            try:
                result = asyncio.run(soak(args, children, database))
            finally:
                children.close()
    except KeyboardInterrupt:
        be.progress("interrupted; stopping the sidecar")
        return 130
    except RuntimeError as exc:
        be.progress(f"error: {exc}")
        return 1
    print_report(result, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0 if all(result["verdicts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
