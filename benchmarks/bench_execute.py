#!/usr/bin/env python
"""ExecuteTool throughput and latency: the real sidecar against a bare grpcio echo server.

    python benchmarks/bench_execute.py [--calls N] [--concurrency 1,16,64] [--repeat 3] [--json]

In one run this script

1. starts the real sidecar in a child process (``python -m sidecar serve --config <tmp yaml>``:
   dev auth, bundled policies, a temporary SQLite store, ``log_level: WARNING``) on a Unix
   socket in a temporary directory, and waits until gRPC health reports SERVING;
2. makes one real ``calculate`` call to it and keeps the reply;
3. starts a bare ``grpc.aio`` echo server in a second child process (this file with
   ``--echo-server``), also on a Unix socket, whose ``ExecuteTool`` returns that reply as is;
4. drives both with the same client: one ``grpc.aio`` channel per server, the generated stub,
   the same request, ``concurrency`` workers each looping over calls, a warm-up, then a
   fixed number of measured calls (bounded in time too);
5. prints calls/s, p50 and p99 latency per server and the ratio sidecar/echo of calls/s,
   each the median over ``--repeat`` runs (echo and sidecar alternate).

Every reply is checked (status SUCCESS and the expected data); failures are counted,
printed, and make the exit code 1. With ``--json`` the table goes to stderr and a JSON
document to stdout. Both children and the temporary directory are removed on exit,
also after Ctrl-C or an error. See benchmarks/README.md for how to read the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

TOOL = "calculate"
ARGUMENTS = {"operation": "add", "operands": [2, 3]}
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ToolService"].full_name
CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0
# The sidecar's own server options (sidecar/server/app.py, default Limits), so the echo
# server differs only in what its handler does.
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]
MAX_FAILURES_SHOWN = 5
ARGUMENT_MODES = ("repeated", "distinct")
TARGET_RATIOS = {"repeated": 0.65, "distinct": 0.5}  # sidecar / echo calls/s at 16 in flight (issue 12)
TARGET_ADDED_P99_MS = 1.0  # p99 the sidecar adds at half of its peak load
TARGET_CPU_RATIOS = {"repeated": 2.0, "distinct": 2.5}  # sidecar / echo server CPU per call at 16 in flight (issue 27)
TARGET_ADDED_AT_1_MS = {"p50": 0.25, "p99": 0.5}  # latency the sidecar adds at 1 in flight (issue 27)
TARGET_CONCURRENCY = (1, 16)  # the levels --targets measures
STOP = threading.Event()  # set on SIGINT/SIGTERM: workers stop looping


# --- children ---------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: have the kernel SIGTERM this process when its parent dies (no orphans after a SIGKILL)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: do not use preexec_fn


class EchoServicer(pb_grpc.ToolServiceServicer):
    """``ExecuteTool`` returns one fixed, pre-built ``ToolResult``; nothing else happens."""

    def __init__(self, reply: pb.ToolResult) -> None:
        self._reply = reply

    async def ExecuteTool(self, request: pb.ExecuteToolRequest, context: grpc.aio.ServicerContext) -> pb.ToolResult:
        return self._reply


async def _echo_main(address: str, reply_path: Path) -> None:
    reply = pb.ToolResult.FromString(reply_path.read_bytes())
    server = grpc.aio.server(options=SERVER_OPTIONS)
    pb_grpc.add_ToolServiceServicer_to_server(EchoServicer(reply), server)
    server.add_insecure_port(address)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    await stop.wait()
    await server.stop(1.0)


def run_echo_server(address: str, reply_path: str) -> int:
    """Entry point of the echo child (``--echo-server ADDRESS REPLY_FILE``)."""
    _die_with_parent()
    asyncio.run(_echo_main(address, Path(reply_path)))
    return 0


class Children:
    """The two server processes and the temporary directory; ``close`` removes all of them."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="toolbooth-bench-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str, argv: list[str], *, pdeathsig: bool,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log_path = self.tmp / f"{name}.log"
        self.logs[name] = log_path
        # preexec_fn is only safe while this process has one thread: the sidecar starts before any
        # gRPC channel exists. The echo child sets the same flag itself.
        single_threaded = _thread_count() == 1
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=_die_with_parent if pdeathsig and single_threaded else None,
            )
        self.procs[name] = proc
        return proc

    def check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = self.logs[name].read_text(errors="replace")
        except OSError:
            return "(no log)"
        return textwrap.indent("\n".join(text.splitlines()[-lines:]) or "(empty log)", "  | ")

    def log_problems(self, name: str) -> list[str]:
        """Lines of a child's log at level ERROR or above, and tracebacks."""
        try:
            text = self.logs[name].read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if " ERROR " in line or " CRITICAL " in line
                or line.startswith("Traceback")]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def unmetered_policies(root: Path) -> Path:
    """The bundled policies copied to ``root`` without their meters: a benchmark's load of writes by one principal,
    not the default limit of writes per principal, is what it measures."""
    from sidecar.config import bundled_policy_dir

    shutil.copytree(bundled_policy_dir(), root)
    data = json.loads((root / "data.json").read_text())
    data["toolbooth"]["history"]["meters"] = {}
    (root / "data.json").write_text(json.dumps(data))
    return root


def write_sidecar_config(tmp: Path, socket_path: Path, *, decision_cache: bool) -> Path:
    """Embedded defaults except: listen on ``socket_path``, a fresh SQLite file, WARNING logs,
    and (with ``decision_cache`` False) no decision cache: every call is decided anew."""
    config = {
        "server": {"listen": [f"unix://{socket_path}"]},
        "auth": {"mode": "dev"},
        "policy": {"cache": {"enabled": decision_cache}},
        "store": {"sqlite_path": str(tmp / "state" / "toolbooth.db")},
        "log_level": "WARNING",
    }
    path = tmp / "sidecar.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def sidecar_env_clean() -> None:
    """TOOLBOOTH_* variables of the caller would override the benchmark's config: drop them."""
    for name in [n for n in os.environ if n.startswith("TOOLBOOTH_")]:
        del os.environ[name]


async def wait_ready(children: Children, name: str, target: str,
                     probe: Callable[[grpc.aio.Channel], Awaitable[bool]], *,
                     timeout: float = START_TIMEOUT_S) -> None:
    """Poll ``probe`` on a channel to ``target`` until it is true, while the child stays alive (at most
    ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(target) as channel:
        while True:
            children.check_alive(name)
            with contextlib.suppress(grpc.aio.AioRpcError):
                if await probe(channel):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout:.0f} s:\n{children.log_tail(name)}")
            await asyncio.sleep(0.1)


async def health_serving(channel: grpc.aio.Channel) -> bool:
    """The sidecar reports SERVING once it is listening with plugins and policies loaded."""
    request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    reply = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=1.0)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def answers(request: pb.ExecuteToolRequest) -> Callable[[grpc.aio.Channel], Awaitable[bool]]:
    """The echo server has no health service: ready once one ExecuteTool succeeds."""

    async def probe(channel: grpc.aio.Channel) -> bool:
        await pb_grpc.ToolServiceStub(channel).ExecuteTool(request, timeout=1.0)
        return True

    return probe


# --- measuring --------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured run of one server at one concurrency."""

    server: str
    concurrency: int
    calls: int
    failures: int
    seconds: float
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    stopped_by_time: bool
    server_cpu_ms_per_call: float | None = None
    client_cpu_ms_per_call: float | None = None
    failure_samples: dict[str, int] = field(default_factory=dict)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` (all its threads) from /proc; ``None`` where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n*q/100), at least 1
    return sorted_values[int(rank) - 1]


def describe_failure(reply: pb.ToolResult) -> str:
    if reply.status != pb.STATUS_SUCCESS:
        error = reply.error
        return (f"status {pb.Status.Name(reply.status)}: {pb.ErrorCode.Name(error.code)} "
                f"{error.message!r}")
    return f"unexpected data_json {reply.data_json!r}"


Call = Callable[[], Awaitable["str | None"]]
"""One call of a benchmark: ``None`` when it returned the expected result, else what went wrong."""


def grpc_call(stub: pb_grpc.ToolServiceStub, request: pb.ExecuteToolRequest, expected_data: str) -> Call:
    """``ExecuteTool(request)`` through ``stub``, expecting SUCCESS with ``expected_data``."""

    async def call() -> str | None:
        try:
            reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return f"gRPC {exc.code().name}: {exc.details()}"
        if reply.status != pb.STATUS_SUCCESS or reply.data_json != expected_data:
            return describe_failure(reply)
        return None

    return call


def distinct_grpc_call(stub: pb_grpc.ToolServiceStub, *, check_result: bool, conversation_id: str | None = None,
                       first: int = 1) -> Call:
    """``ExecuteTool`` of ``calculate`` add [2, n] with a new ``n`` on every call (from ``first``), so no two calls
    share their arguments (nor their authz and approval decisions); the result must be ``2 + n`` when
    ``check_result`` (the echo answers every call alike: its replies are parsed as well, so the client does the same
    work). Each call in ``conversation_id``, if given."""
    numbers = itertools.count(first)

    async def call() -> str | None:
        n = next(numbers)
        request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=f'{{"operation":"add","operands":[2,{n}]}}',
                                        conversation_id=conversation_id)
        try:
            reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return f"gRPC {exc.code().name}: {exc.details()}"
        if reply.status != pb.STATUS_SUCCESS:
            return describe_failure(reply)
        result = json.loads(reply.data_json).get("result")
        return None if not check_result or result == 2 + n else f"add [2, {n}] gave {result!r}"

    return call


def call_of(arguments: str, stub: pb_grpc.ToolServiceStub, request: pb.ExecuteToolRequest, expected_data: str, *,
            check_result: bool, first: int = 1) -> Call:
    """The call of an ``--arguments`` mode: ``request`` every time expecting ``expected_data`` (``repeated``), or
    ``distinct_grpc_call`` in ``request``'s conversation from ``first`` (``distinct``; ``check_result`` as there)."""
    if arguments == "repeated":
        return grpc_call(stub, request, expected_data)
    return distinct_grpc_call(stub, check_result=check_result, conversation_id=request.conversation_id or None,
                              first=first)


async def measure(server: str, call: Call, *, concurrency: int, calls: int, max_seconds: float,
                  server_pid: int) -> Run:
    """``concurrency`` workers share ``calls`` calls; they stop early after ``max_seconds``.

    Also records the CPU time the server process and this client process spent per call.
    """
    latencies: list[float] = []
    failures: collections.Counter[str] = collections.Counter()
    remaining = calls
    clock = time.perf_counter
    server_cpu, client_cpu = process_cpu_seconds(server_pid), time.process_time()
    start = clock()
    deadline = start + max_seconds

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and clock() < deadline and not STOP.is_set():
            remaining -= 1
            sent = clock()
            failure = await call()
            latencies.append(clock() - sent)
            if failure is not None:
                failures[failure] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _ended(server, concurrency, latencies, failures, start, server_pid, server_cpu, client_cpu,
                  stopped_by_time=remaining > 0)


async def paced(server: str, call: Call, *, rate: float, calls: int, max_seconds: float, server_pid: int) -> Run:
    """An open loop: ``calls`` calls sent at ``rate`` per second whatever the replies do (each one when it is due,
    as many in flight as that takes); a call's latency counts from when it was due, so a client or server that
    falls behind shows in it. Stops sending after ``max_seconds``."""
    latencies: list[float] = []
    failures: collections.Counter[str] = collections.Counter()
    clock = time.perf_counter
    server_cpu, client_cpu = process_cpu_seconds(server_pid), time.process_time()
    start = clock()
    in_flight: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        failure = await call()
        latencies.append(clock() - due)
        if failure is not None:
            failures[failure] += 1

    sent = 0
    while sent < calls and not STOP.is_set() and clock() - start < max_seconds:
        due = start + sent / rate
        if (wait := due - clock()) > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(due))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        sent += 1
    await asyncio.gather(*in_flight)
    return _ended(server, 0, latencies, failures, start, server_pid, server_cpu, client_cpu,
                  stopped_by_time=sent < calls)


def _ended(server: str, concurrency: int, latencies: list[float], failures: collections.Counter[str], start: float,
           server_pid: int, server_cpu: float | None, client_cpu: float, *, stopped_by_time: bool) -> Run:
    """The ``Run`` of calls that took ``latencies``, started at ``start`` (``perf_counter``), with the CPU times
    of the server and this client then."""
    seconds = time.perf_counter() - start
    client_cpu = time.process_time() - client_cpu
    server_cpu_end = process_cpu_seconds(server_pid)
    server_cpu = None if server_cpu is None or server_cpu_end is None else server_cpu_end - server_cpu
    latencies.sort()

    def per_call(cpu: float | None) -> float | None:
        return None if cpu is None or not latencies else cpu * 1000 / len(latencies)

    return Run(
        server=server, concurrency=concurrency, calls=len(latencies), failures=sum(failures.values()),
        seconds=seconds, calls_per_s=len(latencies) / seconds if seconds else 0.0,
        p50_ms=percentile(latencies, 50) * 1000, p99_ms=percentile(latencies, 99) * 1000,
        stopped_by_time=stopped_by_time, server_cpu_ms_per_call=per_call(server_cpu),
        client_cpu_ms_per_call=per_call(client_cpu), failure_samples=dict(failures.most_common(MAX_FAILURES_SHOWN)),
    )


def summarize(runs: list[Run]) -> dict[str, Any]:
    return {
        "calls_per_s": statistics.median(r.calls_per_s for r in runs),
        "p50_ms": statistics.median(r.p50_ms for r in runs),
        "p99_ms": statistics.median(r.p99_ms for r in runs),
        "server_cpu_ms_per_call": _median_or_none(r.server_cpu_ms_per_call for r in runs),
        "client_cpu_ms_per_call": _median_or_none(r.client_cpu_ms_per_call for r in runs),
        "failures": sum(r.failures for r in runs),
        "runs": [asdict(r) for r in runs],
    }


def _median_or_none(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# --- output -----------------------------------------------------------------------------------------------


def _label(level: dict[str, Any]) -> str:
    return str(level["concurrency"]) + ("" if level["arguments"] == "repeated" else f" {level['arguments']}")


def format_table(levels: list[dict[str, Any]]) -> str:
    header = ("conc", "echo calls/s", "sidecar calls/s", "ratio", "echo p50", "sidecar p50", "echo p99",
              "sidecar p99", "failures")
    rows = [header]
    for level in levels:
        echo, side = level["echo"], level["sidecar"]
        rows.append((
            _label(level), f"{echo['calls_per_s']:.0f}", f"{side['calls_per_s']:.0f}",
            f"{level['ratio']:.2f}", f"{echo['p50_ms']:.2f} ms", f"{side['p50_ms']:.2f} ms",
            f"{echo['p99_ms']:.2f} ms", f"{side['p99_ms']:.2f} ms", str(echo["failures"] + side["failures"]),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_cpu_table(levels: list[dict[str, Any]]) -> str:
    ms = _ms

    header = ("conc", "echo server", "sidecar server", "sidecar/echo", "client (echo run)", "client (sidecar run)")
    rows = [header]
    for level in levels:
        echo, side = level["echo"], level["sidecar"]
        e, s = echo["server_cpu_ms_per_call"], side["server_cpu_ms_per_call"]
        ratio = level["server_cpu_ratio"]
        rows.append((_label(level), ms(e), ms(s), "n/a" if ratio is None else f"{ratio:.1f}x",
                     ms(echo["client_cpu_ms_per_call"]), ms(side["client_cpu_ms_per_call"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def format_runs(levels: list[dict[str, Any]]) -> str:
    lines = ["per run (calls/s):"]
    for level in levels:
        for server in ("echo", "sidecar"):
            values = ", ".join(f"{r['calls_per_s']:.0f}" for r in level[server]["runs"])
            lines.append(f"  c={_label(level):<12} {server:<7} {values}")
        lines.append(f"  c={_label(level):<12} ratio   " + ", ".join(f"{x:.2f}" for x in level["run_ratios"]))
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per run (default: 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured calls before each run (default: 200)")
    parser.add_argument("--concurrency", default="1,16,64",
                        help="comma-separated in-flight call counts (default: 1,16,64)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per server and level; medians are reported (default: 3)")
    parser.add_argument("--max-seconds", type=float, default=20.0,
                        help="a run stops after this long even if calls remain (default: 20)")
    parser.add_argument("--no-decision-cache", action="store_true",
                        help="turn the decision cache off: the repeated call is decided anew every time")
    parser.add_argument("--arguments", default="repeated",
                        help="comma-separated: repeated (one call, its decisions cached after the first) and/or "
                             "distinct (new operands every call: authz and approval decided anew) (default: repeated)")
    parser.add_argument("--half-peak", action="store_true",
                        help="also drive both servers open-loop at half the sidecar's peak calls/s (at the highest "
                             "--concurrency, first --arguments mode) and report the p99 latency the sidecar adds")
    parser.add_argument("--half-peak-seconds", type=float, default=4.0,
                        help="length of each half-peak run (default: 4)")
    parser.add_argument("--targets", action="store_true",
                        help="the issues' targets in one run: --concurrency 1,16 --arguments repeated,distinct "
                             "--half-peak, and a table of each target's figure, ratio and whether it is met")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON document on stdout (the table then goes to stderr)")
    parser.add_argument("--echo-server", nargs=2, metavar=("ADDRESS", "REPLY_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo_server is None:
        try:
            args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        except ValueError:
            parser.error(f"--concurrency: expected comma-separated integers, got {args.concurrency!r}")
        if not args.levels or min(args.levels) < 1 or args.calls < 1 or args.repeat < 1 or args.warmup < 0:
            parser.error("--concurrency values, --calls and --repeat must be at least 1, --warmup at least 0")
        args.arguments = [x.strip() for x in args.arguments.split(",") if x.strip()]
        if not args.arguments or not set(args.arguments) <= set(ARGUMENT_MODES):
            parser.error(f"--arguments: expected a comma-separated list of {', '.join(ARGUMENT_MODES)}")
        if not args.half_peak_seconds > 0:
            parser.error("--half-peak-seconds must be positive")
        if args.targets:
            args.levels, args.arguments, args.half_peak = list(TARGET_CONCURRENCY), list(ARGUMENT_MODES), True
    return args


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived: stop measuring and clean up."""


async def bench(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    """Run everything; SIGINT/SIGTERM cancel it (``Interrupted``), whatever the calls were doing."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True
        STOP.set()
        task.cancel()

    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, on_signal)
    try:
        async with contextlib.AsyncExitStack() as channels:
            return await _bench(args, children, channels)
    except BaseException as exc:
        if interrupted:
            raise Interrupted from exc
        raise
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)


async def _bench(args: argparse.Namespace, children: Children, channels: contextlib.AsyncExitStack) -> dict[str, Any]:
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS))

    sidecar_sock = children.tmp / "sidecar.sock"
    sidecar_target = f"unix://{sidecar_sock}"
    config = write_sidecar_config(children.tmp, sidecar_sock, decision_cache=not args.no_decision_cache)
    sidecar = children.start("sidecar", [sys.executable, "-m", "sidecar", "serve", "--config", str(config)],
                             pdeathsig=True)
    progress(f"sidecar: pid {sidecar.pid}, {sidecar_target}")
    await wait_ready(children, "sidecar", sidecar_target, health_serving)

    sidecar_channel = await channels.enter_async_context(grpc.aio.insecure_channel(sidecar_target))
    sidecar_stub = pb_grpc.ToolServiceStub(sidecar_channel)
    reply = await sidecar_stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
    if reply.status != pb.STATUS_SUCCESS:
        raise RuntimeError(f"the sidecar's first reply is not a success: {reply}")
    expected_data = reply.data_json
    reply_bytes = reply.SerializeToString()
    (children.tmp / "reply.bin").write_bytes(reply_bytes)

    echo_target = f"unix://{children.tmp / 'echo.sock'}"
    echo = children.start("echo", [sys.executable, str(Path(__file__).resolve()), "--echo-server", echo_target,
                                   str(children.tmp / "reply.bin")], pdeathsig=False)
    progress(f"echo:    pid {echo.pid}, {echo_target}")
    await wait_ready(children, "echo", echo_target, answers(request))
    echo_channel = await channels.enter_async_context(grpc.aio.insecure_channel(echo_target))
    echo_stub = pb_grpc.ToolServiceStub(echo_channel)
    probe = await echo_stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
    progress(f"request {request.ByteSize()} B; reply {len(reply_bytes)} B (sidecar), {probe.ByteSize()} B (echo); "
             f"{args.warmup} warm-up + {args.calls} calls per run, {args.repeat} runs per server and level")

    stubs = {"echo": echo_stub, "sidecar": sidecar_stub}
    calls = {arguments: {server: call_of(arguments, stub, request, expected_data, check_result=server == "sidecar")
                         for server, stub in stubs.items()} for arguments in ARGUMENT_MODES}
    levels = []
    for arguments in args.arguments:
        for concurrency in args.levels:
            levels.append(await _level(args, children, calls[arguments], arguments, concurrency))
    half_peak = None
    if args.half_peak:
        peak = next(level for level in levels if level["arguments"] == args.arguments[0]
                    and level["concurrency"] == max(args.levels))
        half_peak = await _half_peak(args, children, calls[args.arguments[0]], peak)

    return {
        "benchmark": "ExecuteTool calculate add [2,3]: sidecar vs bare grpcio echo",
        "environment": {
            "cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
            "platform": platform.platform(), "note": "client and both servers share the same CPUs",
        },
        "settings": {"calls": args.calls, "warmup": args.warmup, "repeat": args.repeat,
                     "max_seconds": args.max_seconds, "concurrency": args.levels, "arguments": args.arguments,
                     "decision_cache": not args.no_decision_cache},
        "request_bytes": request.ByteSize(),
        "reply_bytes": len(reply_bytes),
        "levels": levels,
        "half_peak": half_peak,
        "failures": sum(level["echo"]["failures"] + level["sidecar"]["failures"]
                        for level in [*levels, *([half_peak] if half_peak else [])]),
        "sidecar_log_problems": children.log_problems("sidecar"),
    }


async def _level(args: argparse.Namespace, children: Children, calls: dict[str, Call], arguments: str,
                 concurrency: int) -> dict[str, Any]:
    """Echo and sidecar at ``concurrency`` in flight, ``args.repeat`` times each, taking turns going first."""
    runs: dict[str, list[Run]] = {"echo": [], "sidecar": []}
    for rep in range(args.repeat):
        for server in ("echo", "sidecar") if rep % 2 == 0 else ("sidecar", "echo"):
            run = await measure_turn(children, server, calls[server], concurrency=concurrency, args=args)
            runs[server].append(run)
            _report_run(f"c={concurrency:<3} {arguments:<8}", rep, args.repeat, run)
    echo_summary, sidecar_summary = summarize(runs["echo"]), summarize(runs["sidecar"])
    echo_cpu, sidecar_cpu = echo_summary["server_cpu_ms_per_call"], sidecar_summary["server_cpu_ms_per_call"]
    return {
        "concurrency": concurrency,
        "arguments": arguments,
        "echo": echo_summary,
        "sidecar": sidecar_summary,
        "ratio": sidecar_summary["calls_per_s"] / echo_summary["calls_per_s"],
        "run_ratios": [s.calls_per_s / e.calls_per_s for e, s in zip(runs["echo"], runs["sidecar"], strict=True)],
        "server_cpu_ratio": sidecar_cpu / echo_cpu if sidecar_cpu is not None and echo_cpu else None,
    }


async def _half_peak(args: argparse.Namespace, children: Children, calls: dict[str, Call],
                     peak: dict[str, Any]) -> dict[str, Any]:
    """Both servers driven at half the sidecar's peak calls/s (``peak``: its level), open loop; the latency the
    sidecar adds is its p99 minus the echo's, each run against the echo run next to it."""
    rate = peak["sidecar"]["calls_per_s"] / 2
    calls_per_run = max(1, round(rate * args.half_peak_seconds))
    runs: dict[str, list[Run]] = {"echo": [], "sidecar": []}
    for rep in range(args.repeat):
        for server in ("echo", "sidecar") if rep % 2 == 0 else ("sidecar", "echo"):
            children.check_alive(server)
            run = await paced(server, calls[server], rate=rate, calls=calls_per_run,
                              max_seconds=args.max_seconds, server_pid=children.procs[server].pid)
            runs[server].append(run)
            _report_run(f"{rate:.0f}/s paced", rep, args.repeat, run)
    added = [s.p99_ms - e.p99_ms for e, s in zip(runs["echo"], runs["sidecar"], strict=True)]
    return {"rate": rate, "arguments": peak["arguments"], "peak_concurrency": peak["concurrency"],
            "echo": summarize(runs["echo"]), "sidecar": summarize(runs["sidecar"]),
            "added_p99_ms": statistics.median(added), "run_added_p99_ms": added}


def _report_run(label: str, rep: int, repeat: int, run: Run) -> None:
    note = " (stopped by --max-seconds)" if run.stopped_by_time else ""
    cpu = run.server_cpu_ms_per_call
    cpu_text = "" if cpu is None else f"  server cpu {cpu:.3f} ms/call"
    progress(f"  {label} run {rep + 1}/{repeat} {run.server:<7} {run.calls_per_s:8.0f} calls/s  "
             f"p50 {run.p50_ms:7.2f} ms  p99 {run.p99_ms:7.2f} ms{cpu_text}  {run.calls} calls, "
             f"{run.failures} failures{note}")
    for text, count in run.failure_samples.items():
        progress(f"      FAILURE x{count}: {text}")


def _what(level: dict[str, Any], results: dict[str, Any]) -> str:
    """A target row's words for the calls of ``level``."""
    what = "cache hits" if level["arguments"] == "repeated" else "distinct arguments"
    return what if results["settings"]["decision_cache"] else what + ", no decision cache"


def target_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The issues' targets that this run measured: (target, figure, ratio, wanted, met). At 16 in flight the ratio
    of calls/s (issue 12) and of server CPU per call (issue 27) to the echo's, at half of peak the p99 added, at 1
    in flight the p50 and p99 added; each from the medians of the runs (``summarize``)."""
    rows = []
    for level in results["levels"]:
        wanted = TARGET_RATIOS.get(level["arguments"])
        if level["concurrency"] == 16 and wanted is not None:
            what = _what(level, results)
            rows.append((f"ExecuteTool c=16, {what}", f"{level['sidecar']['calls_per_s']:.0f} calls/s "
                         f"(echo {level['echo']['calls_per_s']:.0f})", f"{level['ratio']:.2f}", f">= {wanted}",
                         met(level["ratio"] >= wanted)))
    if (half := results["half_peak"]) is not None:
        rows.append((f"added p99 at {half['rate']:.0f}/s (half of peak)",
                     f"{half['sidecar']['p99_ms']:.2f} - {half['echo']['p99_ms']:.2f} ms",
                     f"{half['added_p99_ms']:.2f} ms", f"<= {TARGET_ADDED_P99_MS} ms",
                     met(half["added_p99_ms"] <= TARGET_ADDED_P99_MS)))
    for level in results["levels"]:
        wanted = TARGET_CPU_RATIOS.get(level["arguments"])
        if level["concurrency"] == 16 and wanted is not None:
            echo, side = level["echo"]["server_cpu_ms_per_call"], level["sidecar"]["server_cpu_ms_per_call"]
            ratio = level["server_cpu_ratio"]
            rows.append((f"server CPU per call c=16, {_what(level, results)} / echo",
                         f"{_ms(side)} ms (echo {_ms(echo)})", "n/a" if ratio is None else f"{ratio:.2f}",
                         f"<= {wanted}", met(ratio is not None and ratio <= wanted)))
    for level in results["levels"]:
        if level["concurrency"] == 1:
            for quantile, wanted_ms in TARGET_ADDED_AT_1_MS.items():
                echo_ms, side_ms = level["echo"][f"{quantile}_ms"], level["sidecar"][f"{quantile}_ms"]
                added = side_ms - echo_ms
                rows.append((f"added {quantile} at c=1, {_what(level, results)}", f"{side_ms:.2f} - {echo_ms:.2f} ms",
                             f"{added:.2f} ms", f"<= {wanted_ms} ms", met(added <= wanted_ms)))
    return rows


def met(yes: bool) -> str:
    """A target table's verdict cell."""
    return "yes" if yes else "NO"


def format_rows(rows: list[tuple[str, ...]]) -> str:
    """``rows`` (the first is the header) as left-aligned columns, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


TARGET_HEADER = ("target", "figure", "ratio", "wanted", "met")


def raise_keyboard_interrupt(number: int, frame: object) -> None:
    raise KeyboardInterrupt


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a child binds it next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_with_children(bench: Callable[[argparse.Namespace, Children], Awaitable[dict[str, Any]]],
                      args: argparse.Namespace, *, what: str = "the servers") -> dict[str, Any] | int:
    """``bench``'s results with children of its own, stopped on every way out; or the exit code of a run
    interrupted (130: Ctrl-C, SIGTERM) or failed (1), said on stderr."""
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)  # until the bench installs its own handlers
    sidecar_env_clean()
    children = Children()
    try:
        return asyncio.run(bench(args, children))
    except (KeyboardInterrupt, Interrupted):
        progress(f"interrupted; stopping {what}")
        return 130
    except RuntimeError as exc:
        progress(f"error: {exc}")
        return 1
    finally:
        children.close()


async def measure_turn(children: Children, name: str, call: Call, *, concurrency: int,
                       args: argparse.Namespace) -> Run:
    """One measured run of the child ``name`` (``args.calls`` calls) after its own warm-up (``args.warmup``)."""
    children.check_alive(name)
    pid = children.procs[name].pid
    if args.warmup:
        await measure(name, call, concurrency=concurrency, calls=args.warmup, max_seconds=args.max_seconds,
                      server_pid=pid)
    return await measure(name, call, concurrency=concurrency, calls=args.calls, max_seconds=args.max_seconds,
                         server_pid=pid)


def finish(results: dict[str, Any], out: TextIO, *, json_out: bool, problems: Sequence[str] = ()) -> int:
    """The end of a benchmark's report: the first of the servers' log ``problems``, the failed calls, the JSON
    document on stdout when ``json_out``; the exit code (1 if a call failed)."""
    if problems:
        print(f"server log: {len(problems)} error line(s), first: {problems[0]}", file=out)
    if results["failures"]:
        print(f"FAILURES: {results['failures']} calls did not return the expected result (see above)", file=out)
    if json_out:
        print(json.dumps(results, indent=2))
    return 1 if results["failures"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.echo_server is not None:
        return run_echo_server(*args.echo_server)

    results = run_with_children(bench, args)
    if isinstance(results, int):
        return results
    table = format_table(results["levels"])
    out = sys.stderr if args.json else sys.stdout
    print(f"\nExecuteTool {TOOL} {json.dumps(ARGUMENTS)}; medians of {args.repeat} runs of {args.calls} calls; "
          f"{os.cpu_count()} CPUs shared by client and servers", file=out)
    print(table, file=out)
    print("ratio = sidecar calls/s / echo calls/s (1.0: the sidecar costs nothing over bare grpcio)", file=out)
    print("\nCPU time per call (ms, medians; server = that server process, all threads; client = this process)",
          file=out)
    print(format_cpu_table(results["levels"]), file=out)
    print(format_runs(results["levels"]), file=out)
    if (half := results["half_peak"]) is not None:
        echo, side = half["echo"], half["sidecar"]
        print(f"\nhalf of peak: {half['rate']:.0f} calls/s open loop ({half['arguments']} arguments; peak at "
              f"c={half['peak_concurrency']}), medians: echo p50 {echo['p50_ms']:.2f} / p99 {echo['p99_ms']:.2f} ms, "
              f"sidecar p50 {side['p50_ms']:.2f} / p99 {side['p99_ms']:.2f} ms; added p99 "
              f"{half['added_p99_ms']:.2f} ms (runs " + ", ".join(f"{x:.2f}" for x in half["run_added_p99_ms"])
              + f"); server cpu ms/call echo {_ms(echo['server_cpu_ms_per_call'])}, sidecar "
              f"{_ms(side['server_cpu_ms_per_call'])}", file=out)
    if args.targets:
        print("\n" + format_rows([TARGET_HEADER, *target_rows(results)]), file=out)
    return finish(results, out, json_out=args.json, problems=results["sidecar_log_problems"])


if __name__ == "__main__":
    raise SystemExit(main())
