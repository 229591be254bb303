#!/usr/bin/env python
"""What the transport leaves the gate: the bare grpc.aio echo, the sync grpcio server, the sidecar's own server.

    python benchmarks/bench_transport.py [--calls N] [--concurrency 16] [--repeat 3] [--threads 16] [--json]

In one run this script starts, each in a child process on a Unix socket (helpers from ``bench_execute``):

- ``sidecar``: the real sidecar (``toolbooth serve`` with ``bench_execute``'s config), whose first reply to
  ``calculate`` every other server then returns as is;
- ``aio``: the bare ``grpc.aio`` echo of ``bench_execute`` (the baseline of every ratio);
- ``sync``: the bare sync grpcio server (``grpc.server`` over a thread pool of ``--threads``) answering alike;
- ``sync_loop``: that sync server, each call handed to an asyncio event loop on a thread of its own and waited
  for (``asyncio.run_coroutine_threadsafe``), the handler a coroutine that answers at once: the least a sync
  server costs that serves the pipeline, whose stages are asyncio code;
- ``shell``: the sidecar's own gRPC server (``sidecar.server.app.create_server``: its interceptors, dev
  authentication, servicer and proto conversion) over a gateway that answers each call at once with that
  reply: the most calls/s any pipeline can reach behind the sidecar's grpc.aio server.

Then it measures each at ``--concurrency`` calls in flight (the same client and request as ``bench_execute``,
every reply checked, the order alternating per repeat) and prints calls/s, p50, p99, the server's CPU per call
and each server's ratio to the ``aio`` echo's calls/s within the same repeat, as medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_execute as be

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

SERVERS = ("aio", "sync", "sync_loop", "shell", "sidecar")
_KINDS = ("sync", "sync_loop", "shell")  # the servers this script itself runs as a child (``--server``)


# --- children ---------------------------------------------------------------------------------------------


class SyncEcho(pb_grpc.ToolServiceServicer):
    """``ExecuteTool`` on the sync server: the reply, at once or through ``loop`` (``sync_loop``)."""

    def __init__(self, reply: pb.ToolResult, loop: asyncio.AbstractEventLoop | None) -> None:
        self._reply, self._loop = reply, loop

    def ExecuteTool(self, request: pb.ExecuteToolRequest, context: grpc.ServicerContext) -> pb.ToolResult:  # type: ignore[override]
        if self._loop is None:
            return self._reply
        return asyncio.run_coroutine_threadsafe(self._answer(), self._loop).result()

    async def _answer(self) -> pb.ToolResult:
        return self._reply


def run_sync_server(address: str, reply: pb.ToolResult, *, threads: int, through_loop: bool) -> None:
    """The sync grpcio server until SIGTERM; with ``through_loop``, every call answered on an event loop thread."""
    loop = None
    if through_loop:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=be.SERVER_OPTIONS)
    pb_grpc.add_ToolServiceServicer_to_server(SyncEcho(reply, loop), server)
    server.add_insecure_port(address)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda number, frame: stop.set())
    stop.wait()
    server.stop(1.0).wait()


class AnsweringGateway:
    """A ``ToolGateway`` whose every ``ExecuteTool`` is answered at once with one result (``shell``)."""

    def __init__(self, reply: pb.ToolResult) -> None:
        from sidecar.api import convert

        self._result = convert.result_from_pb(reply)

    async def execute(self, principal: Any, request: Any, *, caller_deadline: float | None = None) -> Any:
        return self._result


async def run_shell_server(address: str, reply: pb.ToolResult) -> None:
    """The sidecar's own gRPC server (interceptors, dev auth, servicer, conversion) over ``AnsweringGateway``."""
    from sidecar.config import load_settings
    from sidecar.server.app import create_server

    with tempfile.TemporaryDirectory(prefix="toolbooth-shell-") as tmp:
        config = Path(tmp) / "shell.json"
        config.write_text(json.dumps({"server": {"listen": [address]}, "auth": {"mode": "dev"},
                                      "log_level": "WARNING"}))
        _, sidecar = await create_server(load_settings(config, env={}), AnsweringGateway(reply))  # type: ignore[arg-type]
        await sidecar.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await sidecar.stop(1.0)


def run_server(kind: str, address: str, reply_path: str, threads: int) -> int:
    """Entry point of a child (``--server KIND ADDRESS REPLY_FILE``)."""
    be._die_with_parent()
    reply = pb.ToolResult.FromString(Path(reply_path).read_bytes())
    if kind == "shell":
        asyncio.run(run_shell_server(address, reply))
    else:
        run_sync_server(address, reply, threads=threads, through_loop=kind == "sync_loop")
    return 0


# --- the benchmark ----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, children: be.Children) -> dict[str, Any]:
    request = pb.ExecuteToolRequest(tool=be.TOOL, arguments_json=json.dumps(be.ARGUMENTS))
    targets = {name: f"unix://{children.tmp / name}.sock" for name in SERVERS}
    config = be.write_sidecar_config(children.tmp, children.tmp / "sidecar.sock", decision_cache=True)
    children.start("sidecar", [sys.executable, "-m", "sidecar", "serve", "--config", str(config)], pdeathsig=True)
    await be.wait_ready(children, "sidecar", targets["sidecar"], be.health_serving)
    async with contextlib.AsyncExitStack() as channels:
        stubs = {name: pb_grpc.ToolServiceStub(await channels.enter_async_context(grpc.aio.insecure_channel(target)))
                 for name, target in targets.items()}
        reply = await stubs["sidecar"].ExecuteTool(request, timeout=be.CALL_TIMEOUT_S)
        if reply.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"the sidecar's first reply is not a success: {reply}")
        reply_file = children.tmp / "reply.bin"
        reply_file.write_bytes(reply.SerializeToString())
        children.start("aio", [sys.executable, be.__file__, "--echo-server", targets["aio"], str(reply_file)],
                       pdeathsig=False)
        for kind in _KINDS:
            children.start(kind, [sys.executable, __file__, "--server", kind, targets[kind], str(reply_file),
                                  "--threads", str(args.threads)], pdeathsig=False)
        for name in ("aio", *_KINDS):
            await be.wait_ready(children, name, targets[name], be.answers(request))
        calls = {name: be.grpc_call(stub, request, reply.data_json) for name, stub in stubs.items()}
        runs: dict[str, list[be.Run]] = {name: [] for name in SERVERS}
        for rep in range(args.repeat):
            for name in SERVERS if rep % 2 == 0 else tuple(reversed(SERVERS)):
                result = await be.measure_turn(children, name, calls[name], concurrency=args.concurrency, args=args)
                runs[name].append(result)
                cpu = result.server_cpu_ms_per_call
                be.progress(f"  run {rep + 1}/{args.repeat} {name:<9} {result.calls_per_s:8.0f} calls/s  "
                            f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  server cpu "
                            f"{'n/a' if cpu is None else f'{cpu:.3f}'} ms/call  {result.failures} failures")
                for text, count in result.failure_samples.items():
                    be.progress(f"      FAILURE x{count}: {text}")
    run_ratios = {name: [r.calls_per_s / a.calls_per_s for a, r in zip(runs["aio"], runs[name], strict=True)]
                  for name in SERVERS}
    servers = {name: be.summarize(runs[name]) for name in SERVERS}
    return {
        "benchmark": "ExecuteTool calculate: the bare grpc.aio echo, the sync grpcio server, the sync server through "
                     "an event loop, the sidecar's server over a gateway that answers at once, the sidecar",
        "environment": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
                        "load_average": os.getloadavg(), "note": "client and servers share the same CPUs"},
        "settings": {"calls": args.calls, "warmup": args.warmup, "repeat": args.repeat,
                     "concurrency": args.concurrency, "threads": args.threads},
        "servers": servers,
        "run_ratios": run_ratios,
        "ratio": {name: statistics.median(values) for name, values in run_ratios.items()},
        "failures": sum(summary["failures"] for summary in servers.values()),
        "sidecar_log_problems": children.log_problems("sidecar") + children.log_problems("shell"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per run (default: 4000)")
    parser.add_argument("--warmup", type=int, default=400, help="unmeasured calls before each run (default: 400)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default: 16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per server; medians are reported (default: 3)")
    parser.add_argument("--threads", type=int, default=16, help="the sync servers' handler threads (default: 16)")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="a run stops after this long (default: 30)")
    parser.add_argument("--json", action="store_true", help="a JSON document on stdout (the table on stderr)")
    parser.add_argument("--server", nargs=3, metavar=("KIND", "ADDRESS", "REPLY_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.calls, args.concurrency, args.repeat, args.threads) < 1 or args.warmup < 0:
        parser.error("--calls, --concurrency, --repeat and --threads must be at least 1, --warmup at least 0")
    if args.server is not None and args.server[0] not in _KINDS:
        parser.error(f"--server: KIND must be one of {', '.join(_KINDS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.server is not None:
        return run_server(*args.server, threads=args.threads)
    started = time.monotonic()
    results = be.run_with_children(run, args)
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    print(f"\nExecuteTool {be.TOOL} over Unix sockets, {args.concurrency} in flight; medians of {args.repeat} runs of "
          f"{args.calls} calls; {os.cpu_count()} CPUs shared by the client and the servers; load average "
          f"{' '.join(f'{x:.2f}' for x in results['environment']['load_average'])}; "
          f"{time.monotonic() - started:.0f} s", file=out)
    print(f"{'server':<11}{'calls/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/call':>13}{'x aio':>7}", file=out)
    for name in SERVERS:
        summary = results["servers"][name]
        cpu = summary["server_cpu_ms_per_call"]
        print(f"{name:<11}{summary['calls_per_s']:>9.0f}{summary['p50_ms']:>9.2f}{summary['p99_ms']:>9.2f}"
              f"{'n/a' if cpu is None else f'{cpu:.3f}':>13}{results['ratio'][name]:>7.2f}", file=out)
    for name in SERVERS[1:]:
        print(f"  {name} / aio per run: {', '.join(f'{x:.2f}' for x in results['run_ratios'][name])}", file=out)
    return be.finish(results, out, json_out=args.json, problems=results["sidecar_log_problems"])


if __name__ == "__main__":
    raise SystemExit(main())
