#!/usr/bin/env python
"""ExecuteToolBatch against ExecuteTool: what a call costs in a batch of 16, against 16 unary calls in flight.

    python benchmarks/bench_batch.py [--calls N] [--batch-size 16] [--repeat 3] [--json]

In one run this script

1. starts the real sidecar in a child process, as ``bench_execute.py`` does (``python -m sidecar
   serve``: dev auth, bundled policies, a temporary SQLite store, WARNING logs) on a Unix socket, and
   waits until gRPC health reports SERVING;
2. drives it with the same call (``calculate`` add [2, 3]) two ways, from one ``grpc.aio`` channel:
   **unary**, ``batch-size`` workers each looping over ``ExecuteTool`` (that many calls in flight),
   and **batch**, one worker looping over ``ExecuteToolBatch`` of ``batch-size`` such calls
   (``max_concurrency`` = ``batch-size``: that many calls in flight in the sidecar, then the next batch);
3. for every repetition runs both back to back, alternating which goes first, each after its own
   warm-up, and prints per mode the wall time per call (run time / calls, as the client sees it)
   and the sidecar's CPU time per call (all its threads, from ``/proc``), each the median over
   ``--repeat`` runs, and the ratios batch / unary (1.0: a call costs the same in a batch).

Every reply is checked (status SUCCESS and the expected data); failures are counted, printed, and
make the exit code 1. With ``--json`` the table goes to stderr and a JSON document to stdout. The
child and the temporary directory are removed on exit, also after Ctrl-C or an error. See
benchmarks/README.md for how to read the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_execute as base  # the sibling benchmark: its child process, config and /proc helpers

MODES = ("unary", "batch")


@dataclass
class Run:
    """One measured run of one mode."""

    mode: str
    calls: int
    failures: int
    seconds: float
    wall_us_per_call: float
    stopped_by_time: bool
    server_cpu_us_per_call: float | None = None
    client_cpu_us_per_call: float | None = None
    failure_samples: dict[str, int] = field(default_factory=dict)


Operation = Callable[[], Awaitable[list[pb.ToolResult]]]


async def measure(mode: str, operation: Operation, *, workers: int, calls: int, per_operation: int,
                  expected_data: str, max_seconds: float, server_pid: int) -> Run:
    """``workers`` loops of ``operation`` (``per_operation`` calls each time) until ``calls`` calls are done
    or ``max_seconds`` have passed; the wall and CPU time per call."""
    failures: collections.Counter[str] = collections.Counter()
    remaining, done = calls, 0
    clock = time.perf_counter
    server_cpu, client_cpu = base.process_cpu_seconds(server_pid), time.process_time()
    start = clock()
    deadline = start + max_seconds

    async def worker() -> None:
        nonlocal remaining, done
        while remaining > 0 and clock() < deadline and not base.STOP.is_set():
            remaining -= per_operation
            try:
                replies = await operation()
            except grpc.aio.AioRpcError as exc:
                failures[f"gRPC {exc.code().name}: {exc.details()}"] += per_operation
                done += per_operation
                continue
            done += len(replies)
            for reply in replies:
                if reply.status != pb.STATUS_SUCCESS or reply.data_json != expected_data:
                    failures[base.describe_failure(reply)] += 1
            if len(replies) != per_operation:
                failures[f"{len(replies)} results for {per_operation} calls"] += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    seconds = clock() - start
    client_cpu = time.process_time() - client_cpu
    server_end = base.process_cpu_seconds(server_pid)
    server_cpu = None if server_cpu is None or server_end is None else server_end - server_cpu

    def per_call(cpu: float | None) -> float | None:
        return None if cpu is None or not done else cpu * 1e6 / done

    return Run(mode=mode, calls=done, failures=sum(failures.values()), seconds=seconds,
               wall_us_per_call=seconds * 1e6 / done if done else float("nan"), stopped_by_time=remaining > 0,
               server_cpu_us_per_call=per_call(server_cpu), client_cpu_us_per_call=per_call(client_cpu),
               failure_samples=dict(failures.most_common(base.MAX_FAILURES_SHOWN)))


def summarize(runs: list[Run]) -> dict[str, Any]:
    return {
        "wall_us_per_call": statistics.median(r.wall_us_per_call for r in runs),
        "calls_per_s": statistics.median(r.calls / r.seconds for r in runs),
        "server_cpu_us_per_call": base._median_or_none(r.server_cpu_us_per_call for r in runs),
        "client_cpu_us_per_call": base._median_or_none(r.client_cpu_us_per_call for r in runs),
        "failures": sum(r.failures for r in runs),
        "runs": [asdict(r) for r in runs],
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def format_report(results: dict[str, Any]) -> str:
    def us(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0f} µs"

    def times(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    unary, batch = results["unary"], results["batch"]
    size, settings = results["batch_size"], results["settings"]
    rows = [("mode", "calls/s", "wall per call", "sidecar CPU per call", "client CPU per call", "failures")]
    for name, label in (("unary", f"unary, {size} in flight"), ("batch", f"batch of {size}")):
        summary = results[name]
        rows.append((label, f"{summary['calls_per_s']:.0f}", us(summary["wall_us_per_call"]),
                     us(summary["server_cpu_us_per_call"]), us(summary["client_cpu_us_per_call"]),
                     str(summary["failures"])))
    rows.append(("batch / unary", "", times(results["wall_ratio"]), times(results["server_cpu_ratio"]), "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                            strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
    per_run = ", ".join(f"{x:.3f}" for x in results["run_wall_ratios"])
    cpu_runs = ", ".join(f"{x:.3f}" for x in results["run_server_cpu_ratios"])
    head = (f"\nExecuteTool {base.TOOL} {json.dumps(base.ARGUMENTS)}: a batch of {size} against {size} unary calls "
            f"in flight; medians of {settings['repeat']} runs of {settings['calls']} calls; {os.cpu_count()} CPUs "
            "shared by client and sidecar")
    def walls(summary: dict[str, Any]) -> str:
        return ", ".join(f"{run['wall_us_per_call']:.0f}" for run in summary["runs"])

    tail = (f"per-run ratios batch/unary: wall {per_run}; sidecar CPU {cpu_runs}\n"
            f"wall per call per run (µs): unary {walls(unary)}; batch {walls(batch)}\n"
            "target: batch / unary <= 1.05 (a batch adds at most 5% per call)")
    return "\n".join([head, *lines, tail])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3200, help="measured calls per run and mode (default: 3200)")
    parser.add_argument("--warmup", type=int, default=320, help="unmeasured calls before each run (default: 320)")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="calls per batch, and unary calls in flight (default: 16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode; medians are reported (default: 3)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="a run stops after this long even if calls remain (default: 30)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON document on stdout (the table then goes to stderr)")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.batch_size < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--calls, --batch-size and --repeat must be at least 1, --warmup at least 0")
    return args


async def bench(args: argparse.Namespace, children: base.Children) -> dict[str, Any]:
    """Run everything; SIGINT/SIGTERM cancel it (``base.Interrupted``)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True
        base.STOP.set()
        task.cancel()

    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, on_signal)
    try:
        return await _bench(args, children)
    except BaseException as exc:
        if interrupted:
            raise base.Interrupted from exc
        raise
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)


async def _bench(args: argparse.Namespace, children: base.Children) -> dict[str, Any]:
    size = args.batch_size
    request = pb.ExecuteToolRequest(tool=base.TOOL, arguments_json=json.dumps(base.ARGUMENTS))
    batch = pb.ExecuteToolBatchRequest(calls=[request] * size, max_concurrency=size)
    socket = children.tmp / "sidecar.sock"
    target = f"unix://{socket}"
    config = base.write_sidecar_config(children.tmp, socket, decision_cache=True)
    sidecar = children.start("sidecar", [sys.executable, "-m", "sidecar", "serve", "--config", str(config)],
                             pdeathsig=True)
    base.progress(f"sidecar: pid {sidecar.pid}, {target}")
    await base.wait_ready(children, "sidecar", target, base.health_serving)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ToolServiceStub(channel)
        first = await stub.ExecuteTool(request, timeout=base.CALL_TIMEOUT_S)
        if first.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"the sidecar's first reply is not a success: {first}")

        async def unary() -> list[pb.ToolResult]:
            return [await stub.ExecuteTool(request, timeout=base.CALL_TIMEOUT_S)]

        async def batched() -> list[pb.ToolResult]:
            return list((await stub.ExecuteToolBatch(batch, timeout=base.CALL_TIMEOUT_S)).results)

        shapes = {"unary": (unary, size, 1), "batch": (batched, 1, size)}  # operation, workers, calls per operation
        base.progress(f"batch request {batch.ByteSize()} B for {size} calls; {args.warmup} warm-up + {args.calls} "
                      f"calls per run, {args.repeat} runs per mode")
        runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
        for rep in range(args.repeat):
            for mode in MODES if rep % 2 == 0 else reversed(MODES):
                children.check_alive("sidecar")
                operation, workers, per_operation = shapes[mode]
                for calls in ([args.warmup] if args.warmup else []) + [args.calls]:  # the warm-up, then the run
                    run = await measure(mode, operation, workers=workers, calls=calls, per_operation=per_operation,
                                        expected_data=first.data_json, max_seconds=args.max_seconds,
                                        server_pid=sidecar.pid)
                runs[mode].append(run)
                cpu = run.server_cpu_us_per_call
                note = " (stopped by --max-seconds)" if run.stopped_by_time else ""
                base.progress(f"  run {rep + 1}/{args.repeat} {mode:<5} {run.wall_us_per_call:7.0f} µs/call wall"
                              f"{'' if cpu is None else f'  sidecar cpu {cpu:5.0f} µs/call'}  {run.calls} calls, "
                              f"{run.failures} failures{note}")
                for text, count in run.failure_samples.items():
                    base.progress(f"      FAILURE x{count}: {text}")
    unary_summary, batch_summary = summarize(runs["unary"]), summarize(runs["batch"])
    return {
        "benchmark": f"ExecuteToolBatch of {size} vs {size} unary ExecuteTool in flight ({base.TOOL} add [2,3])",
        "environment": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
                        "platform": platform.platform(), "note": "client and sidecar share the same CPUs"},
        "settings": {"calls": args.calls, "warmup": args.warmup, "repeat": args.repeat,
                     "max_seconds": args.max_seconds},
        "batch_size": size,
        "unary": unary_summary,
        "batch": batch_summary,
        "wall_ratio": ratio(batch_summary["wall_us_per_call"], unary_summary["wall_us_per_call"]),
        "server_cpu_ratio": ratio(batch_summary["server_cpu_us_per_call"], unary_summary["server_cpu_us_per_call"]),
        "run_wall_ratios": [b.wall_us_per_call / u.wall_us_per_call
                            for u, b in zip(runs["unary"], runs["batch"], strict=True)],
        "run_server_cpu_ratios": [x for u, b in zip(runs["unary"], runs["batch"], strict=True)
                                  if (x := ratio(b.server_cpu_us_per_call, u.server_cpu_us_per_call)) is not None],
        "failures": unary_summary["failures"] + batch_summary["failures"],
        "sidecar_log_problems": children.log_problems("sidecar"),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, base.raise_keyboard_interrupt)
    base.sidecar_env_clean()
    children = base.Children()
    try:
        results = asyncio.run(bench(args, children))
    except (KeyboardInterrupt, base.Interrupted):
        base.progress("interrupted; stopping the sidecar")
        return 130
    except RuntimeError as exc:
        base.progress(f"error: {exc}")
        return 1
    finally:
        children.close()
    out = sys.stderr if args.json else sys.stdout
    print(format_report(results), file=out)
    return base.finish(results, out, json_out=args.json, problems=results["sidecar_log_problems"])


if __name__ == "__main__":
    raise SystemExit(main())
