#!/usr/bin/env python
"""MCP ``tools/call`` over Streamable HTTP against ``ExecuteTool`` over gRPC, on one sidecar in one run.

    python benchmarks/bench_mcp.py [--calls N] [--concurrency 1,16] [--repeat 3] [--clients sdk,lean]
                                   [--json-response] [--json]

In one run this script

1. starts the real sidecar in a child process (``python -m sidecar serve --config <tmp yaml>``: dev auth,
   bundled policies, a temporary SQLite store, ``log_level: WARNING``) listening on a Unix socket for
   gRPC and on 127.0.0.1 for MCP (``mcp.listen``; ``--json-response`` sets ``mcp.json_response``),
   and waits until gRPC health reports SERVING;
2. drives that one process with ``calculate`` add [2, 3] through up to three clients: gRPC with one
   ``grpc.aio`` channel and the generated stub; MCP with one session of the MCP SDK's own
   ``ClientSession`` over ``streamable_http_client`` (``sdk``); MCP with one session of the lean client
   of ``lean_mcp`` (``lean``: aiohttp, a keep-alive pool, only what the protocol asks of a client), so
   that the client's own CPU does not decide what is measured on a small machine. ``concurrency``
   workers each loop over calls: a warm-up, then a fixed number of measured calls (bounded in time too);
3. prints calls/s, p50 and p99 per client, the ratio of each MCP client's calls/s to gRPC's and the
   CPU per call of the server and of the client, each the median over ``--repeat`` runs (the clients
   take turns going first).

Every reply is checked (SUCCESS and the data of the first gRPC reply; over MCP the ``structuredContent``
of each result); failures are counted, printed, and make the exit code 1. With ``--json`` the table goes
to stderr and a JSON document to stdout. The child and the temporary directory are removed on exit, also
after Ctrl-C or an error.
See benchmarks/README.md for how to read the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx2
from bench_execute import (
    ARGUMENTS,
    CALL_TIMEOUT_S,
    STOP,
    TOOL,
    Call,
    Children,
    Interrupted,
    Run,
    finish,
    free_port,
    grpc_call,
    health_serving,
    measure,
    progress,
    run_with_children,
    summarize,
    wait_ready,
)
from lean_mcp import LeanMcpClient, McpReplyError
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

CLIENTS = {"sdk": "mcp-sdk", "lean": "mcp-lean"}  # --clients value: the name of its runs
LABELS = {"grpc": "gRPC", "mcp-sdk": "MCP, SDK client", "mcp-lean": "MCP, lean client"}


def write_config(tmp: Path, socket_path: Path, port: int, *, json_response: bool) -> Path:
    config = {
        "server": {"listen": [f"unix://{socket_path}"]},
        "auth": {"mode": "dev"},
        "store": {"sqlite_path": str(tmp / "state" / "toolbooth.db")},
        "mcp": {"listen": f"127.0.0.1:{port}", "json_response": json_response},
        "log_level": "WARNING",
    }
    path = tmp / "sidecar.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def check_result(structured: Any, is_error: bool, expected: Any) -> str | None:
    """``None`` for a successful result with ``expected`` data, else what is wrong with it."""
    if is_error or not isinstance(structured, dict) or structured.get("status") != "success" \
            or structured.get("data") != expected:
        return f"MCP result {json.dumps(structured)[:200]}"
    return None


def sdk_call(session: ClientSession, expected: Any) -> Call:
    """``tools/call`` of the benchmark's tool through the SDK's ``session``, expecting ``expected`` data."""

    async def call() -> str | None:
        try:
            answer = await session.call_tool(TOOL, ARGUMENTS, read_timeout_seconds=CALL_TIMEOUT_S)
        except (MCPError, httpx2.HTTPError, OSError, RuntimeError) as exc:  # counted, not fatal
            return f"MCP {type(exc).__name__}: {exc}"
        return check_result(answer.structured_content, answer.is_error, expected)

    return call


def lean_call(client: LeanMcpClient, expected: Any) -> Call:
    """``tools/call`` of the benchmark's tool through the lean ``client``, expecting ``expected`` data."""

    async def call() -> str | None:
        try:
            result, _ = await client.call_tool(TOOL, ARGUMENTS)
        except (McpReplyError, aiohttp.ClientError, OSError, ValueError) as exc:  # counted, not fatal
            return f"MCP {type(exc).__name__}: {exc}"
        return check_result(result.get("structuredContent"), result.get("isError", False), expected)

    return call


def level_report(concurrency: int, runs: dict[str, list[Run]]) -> dict[str, Any]:
    summaries = {name: summarize(client_runs) for name, client_runs in runs.items()}
    grpc_summary, grpc_runs = summaries["grpc"], runs["grpc"]
    report: dict[str, Any] = {"concurrency": concurrency, **summaries, "ratio": {}, "run_ratios": {},
                              "server_cpu_ratio": {}}
    for name in summaries.keys() - {"grpc"}:
        report["ratio"][name] = summaries[name]["calls_per_s"] / grpc_summary["calls_per_s"]
        report["run_ratios"][name] = [m.calls_per_s / g.calls_per_s for g, m in zip(grpc_runs, runs[name], strict=True)]
        mcp_cpu, grpc_cpu = summaries[name]["server_cpu_ms_per_call"], grpc_summary["server_cpu_ms_per_call"]
        report["server_cpu_ratio"][name] = mcp_cpu / grpc_cpu if mcp_cpu is not None and grpc_cpu else None
    return report


def format_table(levels: list[dict[str, Any]], names: list[str]) -> str:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    header = ("conc", "client", "calls/s", "ratio", "p50", "p99", "server ms/call", "client ms/call", "failures")
    rows = [header]
    for level in levels:
        for name in names:
            run = level[name]
            ratio = "1" if name == "grpc" else f"{level['ratio'][name]:.2f}"
            rows.append((str(level["concurrency"]), LABELS[name], f"{run['calls_per_s']:.0f}", ratio,
                         f"{run['p50_ms']:.2f} ms", f"{run['p99_ms']:.2f} ms", ms(run["server_cpu_ms_per_call"]),
                         ms(run["client_cpu_ms_per_call"]), str(run["failures"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if i == 1 else cell.rjust(width)
                       for i, (cell, width) in enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for level in levels:
        for name, ratios in sorted(level["run_ratios"].items()):
            values = ", ".join(f"{x:.2f}" for x in ratios)
            lines.append(f"per run: c={level['concurrency']} {LABELS[name]} ratios {values}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per run (default: 1000)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured calls before each run (default: 100)")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated in-flight call counts (default: 1,16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per client and level (default: 3)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="a run stops after this long even if calls remain (default: 30)")
    parser.add_argument("--clients", default="sdk,lean",
                        help="the MCP clients to run besides gRPC: sdk (the MCP SDK's ClientSession), lean "
                             "(benchmarks/lean_mcp.py); default: sdk,lean")
    parser.add_argument("--json-response", action="store_true",
                        help="mcp.json_response: true (every POST answered with one JSON body, even one that asks "
                             "for progress)")
    parser.add_argument("--json", action="store_true", help="print a JSON document on stdout (table on stderr)")
    args = parser.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--concurrency: expected comma-separated integers, got {args.concurrency!r}")
    if not args.levels or min(args.levels) < 1 or args.calls < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--concurrency values, --calls and --repeat must be at least 1, --warmup at least 0")
    chosen = [x.strip() for x in args.clients.split(",") if x.strip()]
    unknown = sorted(set(chosen) - CLIENTS.keys())
    if not chosen or unknown:
        parser.error(f"--clients: expected a comma-separated list of {', '.join(CLIENTS)}, got {args.clients!r}")
    args.names = ["grpc", *(CLIENTS[x] for x in CLIENTS if x in chosen)]
    return args


async def bench(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    """Run everything; SIGINT/SIGTERM cancel it (``Interrupted``)."""
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
        async with contextlib.AsyncExitStack() as stack:
            return await _bench(args, children, stack)
    except BaseException as exc:
        if interrupted:
            raise Interrupted from exc
        raise
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)


async def _sdk_session(url: str, stack: contextlib.AsyncExitStack) -> ClientSession:
    http = await stack.enter_async_context(httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)))
    read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    await session.list_tools()  # what the client checks each result against
    return session


async def _bench(args: argparse.Namespace, children: Children, stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS))
    sock, port = children.tmp / "sidecar.sock", free_port()
    config = write_config(children.tmp, sock, port, json_response=args.json_response)
    sidecar = children.start("sidecar", [sys.executable, "-m", "sidecar", "serve", "--config", str(config)],
                             pdeathsig=True)
    url = f"http://127.0.0.1:{port}/mcp"
    progress(f"sidecar: pid {sidecar.pid}, gRPC unix://{sock}, MCP {url}"
             f"{' (json_response: every answer JSON)' if args.json_response else ''}")
    await wait_ready(children, "sidecar", f"unix://{sock}", health_serving)

    channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"unix://{sock}"))
    stub = pb_grpc.ToolServiceStub(channel)
    reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
    if reply.status != pb.STATUS_SUCCESS:
        raise RuntimeError(f"the sidecar's first reply is not a success: {reply}")
    expected = json.loads(reply.data_json)
    calls = {"grpc": grpc_call(stub, request, reply.data_json)}
    if "mcp-sdk" in args.names:
        calls["mcp-sdk"] = sdk_call(await _sdk_session(url, stack), expected)
    if "mcp-lean" in args.names:
        lean = await stack.enter_async_context(LeanMcpClient(url, connections=max(args.levels)))
        calls["mcp-lean"] = lean_call(lean, expected)
    progress(f"{args.warmup} warm-up + {args.calls} calls per run, {args.repeat} runs per client and level")

    levels = []
    for concurrency in args.levels:
        runs: dict[str, list[Run]] = {name: [] for name in args.names}
        for rep in range(args.repeat):
            turn = rep % len(args.names)
            for name in args.names[turn:] + args.names[:turn]:
                children.check_alive("sidecar")
                if args.warmup:
                    await measure(name, calls[name], concurrency=concurrency, calls=args.warmup,
                                  max_seconds=args.max_seconds, server_pid=sidecar.pid)
                run = await measure(name, calls[name], concurrency=concurrency, calls=args.calls,
                                    max_seconds=args.max_seconds, server_pid=sidecar.pid)
                runs[name].append(run)
                cpu = "" if run.server_cpu_ms_per_call is None else f"  server cpu {run.server_cpu_ms_per_call:.3f} ms"
                progress(f"  c={concurrency:<3} run {rep + 1}/{args.repeat} {name:<8} {run.calls_per_s:8.0f} calls/s  "
                         f"p50 {run.p50_ms:7.2f} ms  p99 {run.p99_ms:7.2f} ms{cpu}  {run.calls} calls, "
                         f"{run.failures} failures{' (stopped by --max-seconds)' if run.stopped_by_time else ''}")
                for text, count in run.failure_samples.items():
                    progress(f"      FAILURE x{count}: {text}")
        levels.append(level_report(concurrency, runs))
    return {
        "benchmark": "calculate add [2,3]: MCP tools/call (Streamable HTTP; the SDK's and a lean client) vs gRPC "
                     "ExecuteTool, one sidecar",
        "environment": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
                        "platform": platform.platform(), "note": "client and sidecar share the same CPUs"},
        "settings": {"calls": args.calls, "warmup": args.warmup, "repeat": args.repeat, "max_seconds": args.max_seconds,
                     "concurrency": args.levels, "clients": args.names, "json_response": args.json_response},
        "levels": levels,
        "failures": sum(level[name]["failures"] for level in levels for name in args.names),
        "sidecar_log_problems": children.log_problems("sidecar"),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_with_children(bench, args, what="the sidecar")
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    print(f"\n{TOOL} {json.dumps(ARGUMENTS)}; medians of {args.repeat} runs of {args.calls} calls; "
          f"{os.cpu_count()} CPUs shared by client and sidecar", file=out)
    print(format_table(results["levels"], args.names), file=out)
    print("ratio = MCP calls/s / gRPC calls/s (issue target: >= 0.5); server = the sidecar process, all threads",
          file=out)
    return finish(results, out, json_out=args.json, problems=results["sidecar_log_problems"])


if __name__ == "__main__":
    raise SystemExit(main())
