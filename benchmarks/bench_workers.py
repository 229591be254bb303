#!/usr/bin/env python
"""ExecuteTool with ``server.workers: 2`` against one worker and the bare grpcio echo, all on loopback TCP.

    python benchmarks/bench_workers.py [--calls N] [--concurrency 16] [--channels 16] [--repeat 3] [--json]

Workers share one TCP port (SO_REUSEPORT) and the kernel gives each *connection* to one of them, so the
client opens ``--channels`` channels (each its own connection: no subchannel shared between them) and sends
its calls round-robin over them, to every server alike. In one run this script starts (children of this
process, killed with it; helpers from ``bench_execute``):

- the bare ``grpc.aio`` echo (``bench_execute.py --echo-server``) on ``127.0.0.1:PORT``, returning the
  sidecar's own reply to the same request;
- ``toolbooth serve`` with the benchmark config of ``bench_execute`` (dev auth, bundled policies, a fresh
  SQLite file, WARNING logs) on ``127.0.0.1:PORT``, once with ``workers: 1`` and once with ``workers: 2``;

then measures each (echo, workers 1, workers 2, alternating order per repeat) at ``--concurrency`` calls in
flight and prints calls/s, p50, p99, the server CPU per call (every worker process summed) and the ratio of
each to the echo's calls/s within the same repeat, as medians of ``--repeat`` runs. Every reply is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_execute as be

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

SERVERS = ("echo", "workers1", "workers2")
_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def sidecar_config(tmp: Path, name: str, port: int, workers: int) -> Path:
    """``bench_execute``'s sidecar config, on loopback TCP with ``workers`` processes."""
    path = be.write_sidecar_config(tmp / name, tmp / name / "unused.sock", decision_cache=True)
    config = json.loads(path.read_text())
    config["server"] = {"listen": [f"127.0.0.1:{port}"], "workers": workers}
    path.write_text(json.dumps(config, indent=2))
    return path


def process_tree_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` and its children (the workers of a supervisor), from /proc."""
    total = be.process_cpu_seconds(pid)
    if total is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(be.process_cpu_seconds(int(child)) or 0.0 for child in children)


def round_robin(stubs: list[pb_grpc.ToolServiceStub], request: pb.ExecuteToolRequest, expected: str) -> be.Call:
    calls = itertools.cycle([be.grpc_call(stub, request, expected) for stub in stubs])
    return lambda: next(calls)()


async def open_stubs(channels: contextlib.AsyncExitStack, target: str, count: int) -> list[pb_grpc.ToolServiceStub]:
    stubs = []
    for _ in range(count):
        channel = await channels.enter_async_context(grpc.aio.insecure_channel(target, options=_OWN_CONNECTION))
        stubs.append(pb_grpc.ToolServiceStub(channel))
    return stubs


async def run(args: argparse.Namespace, children: be.Children) -> dict[str, Any]:
    request = pb.ExecuteToolRequest(tool=be.TOOL, arguments_json=json.dumps(be.ARGUMENTS))
    targets: dict[str, str] = {}
    for name, workers in (("workers1", 1), ("workers2", 2)):
        port = be.free_port()
        (children.tmp / name).mkdir()
        config = sidecar_config(children.tmp, name, port, workers)
        children.start(name, [sys.executable, "-m", "sidecar", "serve", "--config", str(config)], pdeathsig=True)
        targets[name] = f"127.0.0.1:{port}"
    for name in ("workers1", "workers2"):
        await be.wait_ready(children, name, targets[name], be.health_serving)
    async with contextlib.AsyncExitStack() as channels:
        first = (await open_stubs(channels, targets["workers1"], 1))[0]
        reply = await first.ExecuteTool(request, timeout=be.CALL_TIMEOUT_S)
        if reply.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"the sidecar's first reply is not a success: {reply}")
        (children.tmp / "reply.bin").write_bytes(reply.SerializeToString())
        targets["echo"] = f"127.0.0.1:{be.free_port()}"
        children.start("echo", [sys.executable, str(Path(be.__file__).resolve()), "--echo-server", targets["echo"],
                                str(children.tmp / "reply.bin")], pdeathsig=False)
        await be.wait_ready(children, "echo", targets["echo"], be.answers(request))
        calls = {name: round_robin(await open_stubs(channels, targets[name], args.channels), request, reply.data_json)
                 for name in SERVERS}
        runs: dict[str, list[be.Run]] = {name: [] for name in SERVERS}
        cpu: dict[str, list[float]] = {name: [] for name in SERVERS}
        for rep in range(args.repeat):
            order = SERVERS if rep % 2 == 0 else tuple(reversed(SERVERS))
            for name in order:
                children.check_alive(name)
                pid = children.procs[name].pid
                if args.warmup:
                    await be.measure(name, calls[name], concurrency=args.concurrency, calls=args.warmup,
                                     max_seconds=args.max_seconds, server_pid=pid)
                before = process_tree_cpu(pid)
                result = await be.measure(name, calls[name], concurrency=args.concurrency, calls=args.calls,
                                          max_seconds=args.max_seconds, server_pid=pid)
                after = process_tree_cpu(pid)
                if before is not None and after is not None and result.calls:
                    cpu[name].append((after - before) * 1000 / result.calls)
                runs[name].append(result)
                be.progress(f"  run {rep + 1}/{args.repeat} {name:<8} {result.calls_per_s:8.0f} calls/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  {result.failures} failures")
                for text, count in result.failure_samples.items():
                    be.progress(f"      FAILURE x{count}: {text}")
    summary = {name: be.summarize(runs[name]) for name in SERVERS}
    for name in SERVERS:
        summary[name]["server_cpu_ms_per_call"] = statistics.median(cpu[name]) if cpu[name] else None
    ratios = {name: [s.calls_per_s / e.calls_per_s for e, s in zip(runs["echo"], runs[name], strict=True)]
              for name in ("workers1", "workers2")}
    return {
        "benchmark": "ExecuteTool calculate over loopback TCP: workers 2 and 1 vs the bare grpcio echo",
        "environment": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
                        "load_average": os.getloadavg(), "note": "client and servers share the same CPUs"},
        "settings": {"calls": args.calls, "warmup": args.warmup, "repeat": args.repeat,
                     "concurrency": args.concurrency, "channels": args.channels},
        "servers": summary,
        "run_ratios": ratios,
        "ratio": {name: statistics.median(values) for name, values in ratios.items()},
        "failures": sum(summary[name]["failures"] for name in SERVERS),
        "sidecar_log_problems": children.log_problems("workers1") + children.log_problems("workers2"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per run (default: 4000)")
    parser.add_argument("--warmup", type=int, default=400, help="unmeasured calls before each run (default: 400)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default: 16)")
    parser.add_argument("--channels", type=int, default=16, help="client channels (connections) per server "
                                                                   "(default: 16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per server; medians are reported (default: 3)")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="a run stops after this long (default: 30)")
    parser.add_argument("--json", action="store_true", help="a JSON document on stdout (the table on stderr)")
    args = parser.parse_args(argv)
    if min(args.calls, args.concurrency, args.channels, args.repeat) < 1 or args.warmup < 0:
        parser.error("--calls, --concurrency, --channels and --repeat must be at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    results = be.run_with_children(run, args)
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    print(f"\nExecuteTool {be.TOOL} over 127.0.0.1 TCP, {args.concurrency} in flight over {args.channels} channels; "
          f"medians of {args.repeat} runs of {args.calls} calls; {os.cpu_count()} CPUs shared; load average "
          f"{' '.join(f'{x:.2f}' for x in results['environment']['load_average'])}; "
          f"{time.monotonic() - started:.0f} s", file=out)
    print(f"{'server':<10}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/call':>13}{'x echo':>8}", file=out)
    for name in SERVERS:
        s = results["servers"][name]
        ratio = "1.00" if name == "echo" else f"{results['ratio'][name]:.2f}"
        cpu = "n/a" if s["server_cpu_ms_per_call"] is None else f"{s['server_cpu_ms_per_call']:.3f}"
        print(f"{name:<10}{s['calls_per_s']:>10.0f}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}{cpu:>13}{ratio:>8}",
              file=out)
    for name, values in results["run_ratios"].items():
        print(f"  {name} / echo per run: {', '.join(f'{x:.2f}' for x in values)}", file=out)
    return be.finish(results, out, json_out=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
