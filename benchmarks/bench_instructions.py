#!/usr/bin/env python
"""Instructions per ExecuteTool, counted by valgrind's callgrind: the real sidecar in a baseline config and in variants.

    python benchmarks/bench_instructions.py [--calls N] [--warmup N] [--concurrency 16]
        [--variant NAME=YAML_OR_FILE ...] [--variant-env NAME=VAR=VALUE ...] [--json]

Calls/s on a small shared machine move by tens of per cent between runs of the same code; a count of the
instructions a sidecar executes per call does not (the same count, within a per cent, run after run, whatever
else the machine is doing), so it tells a few per cent of cost apart where calls/s cannot. It is a count, not a
time: an instruction that waits for memory costs more than one that does not. Variants are given as in
``bench_observability.py`` (its ``--variant`` and ``--variant-env``, its OTLP sink for a variant that exports
OTLP), and the baseline is the same config.

For each config, one after the other, it starts the sidecar under ``valgrind --tool=callgrind
--instr-atstart=no`` (so start-up runs at near native speed), waits until it serves, makes ``--warmup`` calls
uncounted, switches instrumentation on (``callgrind_control -i on``), makes ``--warmup`` more calls (so caches and
lazily built state settle), zeroes the counters (``-z``), makes ``--calls`` calls at ``--concurrency`` in flight
with ``bench_execute.py``'s client (``calculate`` add [2, 3], every reply checked), dumps the counters (``-d``)
and stops the sidecar. Every thread of the sidecar counts (the audit writer's, the span exporter's, gRPC's).
Reported: instructions per call and the ratio of each variant to the baseline. Needs ``valgrind`` (Debian's
package); each config takes about a minute for 1000 calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from bench_execute import (
    ARGUMENTS,
    CALL_TIMEOUT_S,
    TOOL,
    Children,
    finish,
    grpc_call,
    health_serving,
    measure,
    progress,
    run_with_children,
    wait_ready,
)
from bench_observability import (
    Variant,
    add_variant_arguments,
    received_spans,
    start_sidecar,
    start_sink,
    variants_of,
)

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

START_TIMEOUT_S = 300.0  # a sidecar under valgrind starts slowly


def require_valgrind(parser: argparse.ArgumentParser) -> None:
    """Stop with a usage error unless valgrind's callgrind and its control tool are installed."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (Debian: apt-get install valgrind)")


def callgrind(pid: int, *options: str) -> None:
    """``callgrind_control OPTIONS PID``: switch instrumentation, zero or dump the counters of a running sidecar."""
    done = subprocess.run(["callgrind_control", *options, str(pid)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(options)} {pid} failed: {done.stderr or done.stdout}")


def dumped_instructions(out: Path) -> int:
    """The instructions of the counters' dump (``-d``) among the files callgrind wrote at ``out``."""
    for path in sorted(out.parent.glob(f"{out.name}*")):
        text = path.read_text(errors="replace")
        if "\ndesc: Trigger: dump" in text:
            return max(int(line.split()[1]) for line in text.splitlines() if line.startswith(("summary:", "totals:")))
    raise RuntimeError(f"callgrind wrote no dump at {out}")


async def counted(args: argparse.Namespace, children: Children, variant: Variant) -> dict[str, Any]:
    """Instructions per call of ``variant``'s sidecar (started, measured and stopped here)."""
    if variant.wants_sink:
        (children.tmp / variant.name).mkdir()
        await start_sink(children, variant)
    out = children.tmp / f"{variant.name}.callgrind"
    target = start_sidecar(children, variant, wrapper=["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                                       f"--callgrind-out-file={out}"])
    await wait_ready(children, variant.name, target, health_serving, timeout=START_TIMEOUT_S)
    pid = children.procs[variant.name].pid
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS))
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ToolServiceStub(channel)
        reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        if reply.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"{variant.name}: the first reply is not a success: {reply}")
        call = grpc_call(stub, request, reply.data_json)

        async def calls(count: int) -> int:
            run = await measure(variant.name, call, concurrency=args.concurrency, calls=count,
                                max_seconds=args.max_seconds, server_pid=pid)
            for text, times in run.failure_samples.items():
                progress(f"      FAILURE x{times}: {text}")
            return run.failures

        started = time.monotonic()
        failures = await calls(args.warmup)
        callgrind(pid, "-i", "on")
        failures += await calls(args.warmup)
        callgrind(pid, "-z")
        failures += await calls(args.calls)
        callgrind(pid, "-d")
        callgrind(pid, "-i", "off")
    variant.calls_sent += 1 + 2 * args.warmup + args.calls
    instructions = dumped_instructions(out) / args.calls
    spans = received_spans(children, variant) if variant.sink_count else None
    progress(f"  {variant.name:<12} {instructions / 1000:9.1f} k instructions per call  ({failures} failures, "
             f"{time.monotonic() - started:.0f} s)")
    return {"name": variant.name, "overlay": variant.overlay, "env": variant.env, "instructions_per_call": instructions,
            "failures": failures, "spans_per_call": None if spans is None else spans / variant.calls_sent,
            "log_problems": children.log_problems(variant.name)}


async def bench(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    configs = [await counted(args, children, variant) for variant in args.variants]
    base = configs[0]["instructions_per_call"]
    for config in configs:
        config["ratio"] = config["instructions_per_call"] / base
    return {
        "benchmark": f"instructions per ExecuteTool {TOOL} add [2,3] at {args.concurrency} in flight (callgrind): "
                     "variants vs the baseline config",
        "environment": {"python": platform.python_version(), "grpcio": grpc.__version__,
                        "platform": platform.platform()},
        "settings": {"calls": args.calls, "warmup": args.warmup, "concurrency": args.concurrency},
        "configs": configs,
        "failures": sum(config["failures"] for config in configs),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="counted calls per config (default: 1000)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="calls before counting, once uninstrumented and once instrumented (default: 200)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default: 16)")
    parser.add_argument("--max-seconds", type=float, default=900.0,
                        help="a run stops after this long even if calls remain (default: 900)")
    add_variant_arguments(parser)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.calls < 1 or args.warmup < 0:
        parser.error("--concurrency and --calls must be at least 1, --warmup at least 0")
    args.variants = variants_of(args)
    require_valgrind(parser)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_with_children(bench, args, what="the sidecars")
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    print(f"\nInstructions per ExecuteTool {TOOL} {json.dumps(ARGUMENTS)} at {args.concurrency} in flight, "
          f"{args.calls} calls counted per config (callgrind, every thread of the sidecar)", file=out)
    print(f"{'config':<14}{'k instr/call':>14}{'ratio':>8}{'spans/call':>12}", file=out)
    for config in results["configs"]:
        spans = "-" if config["spans_per_call"] is None else f"{config['spans_per_call']:.2f}"
        print(f"{config['name']:<14}{config['instructions_per_call'] / 1000:>14.1f}{config['ratio']:>8.3f}"
              f"{spans:>12}", file=out)
        if config["log_problems"]:
            print(f"  {config['name']} log: {len(config['log_problems'])} error line(s), first: "
                  f"{config['log_problems'][0]}", file=out)
    return finish(results, out, json_out=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
