#!/usr/bin/env python
"""Instructions per ExecuteTool, counted by valgrind's callgrind: the real sidecar in a baseline config and in variants,
and the bare grpcio echo server.

    python benchmarks/bench_instructions.py [--calls N] [--warmup N] [--concurrency 16] [--repeat N]
        [--arguments repeated|distinct|repeated,distinct] [--variant NAME=YAML_OR_FILE ...]
        [--variant-env NAME=VAR=VALUE ...] [--targets] [--json]

Calls/s on a small shared machine move by tens of per cent between runs of the same code; a count of the
instructions a sidecar executes per call does not (the same count, within a per cent, run after run, whatever
else the machine is doing), so it tells a few per cent of cost apart where calls/s cannot. It is a count, not a
time: an instruction that waits for memory costs more than one that does not. Variants are given as in
``bench_observability.py`` (its ``--variant`` and ``--variant-env``, its OTLP sink for a variant that exports
OTLP), and the baseline is the same config. The last config is ``echo``: ``bench_execute.py``'s bare grpcio echo
server (its ``--echo-server``, the same server options), answering every call with the bytes of the sidecar's
first reply, so that each sidecar config's count is also a ratio to what bare grpcio costs per call.

For each config, one after the other, it starts the server under ``valgrind --tool=callgrind
--instr-atstart=no`` (so start-up runs at near native speed), waits until it serves, makes ``--warmup`` calls
uncounted, switches instrumentation on (``callgrind_control -i on``), makes ``--warmup`` more calls (so caches and
lazily built state settle), zeroes the counters (``-z``), makes ``--calls`` calls at ``--concurrency`` in flight
with ``bench_execute.py``'s client (every reply checked), dumps the counters (``-d``) and stops the server. Every
thread of the server counts (the audit writer's, the span exporter's, gRPC's). ``--arguments``: ``repeated``
(``calculate`` add [2, 3] every call: the decisions come from the cache after the first) or ``distinct`` (add
[2, n], a new n every call: authz and approval are decided anew for each; the sidecar's result must be 2 + n, the
echo's replies are parsed alike), or both, one after the other. With ``--repeat`` the configs alternate in order
from one repetition to the next, and medians are reported. Reported: instructions per call, the ratio of each
config to the baseline and to the echo; ``--targets`` (the baseline and the echo only unless ``--variant`` is
given, both argument modes) adds issue 27's targets for the ratio to the echo. Needs ``valgrind`` (Debian's
package); each config takes about a minute for 1000 calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from bench_execute import (
    ARGUMENT_MODES,
    ARGUMENTS,
    CALL_TIMEOUT_S,
    TARGET_HEADER,
    TOOL,
    Call,
    Children,
    answers,
    call_of,
    finish,
    format_rows,
    health_serving,
    measure,
    met,
    progress,
    run_with_children,
    wait_ready,
)
from bench_observability import (
    BASELINE,
    Variant,
    add_variant_arguments,
    received_spans,
    start_sidecar,
    start_sink,
    stop_child,
    variants_of,
)

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 300.0  # a sidecar under valgrind starts slowly
ECHO = "echo"  # the bare grpcio echo server's config
REPLY = "reply.bin"  # the sidecar's first reply, which the echo answers with
TARGET_ECHO_RATIOS = {"repeated": 2.0, "distinct": 2.5}  # sidecar / echo instructions per call at 16 in flight


def require_valgrind(parser: argparse.ArgumentParser) -> None:
    """Stop with a usage error unless valgrind's callgrind and its control tool are installed."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (Debian: apt-get install valgrind)")


def callgrind(pid: int, *options: str) -> None:
    """``callgrind_control OPTIONS PID``: switch instrumentation, zero or dump the counters of a running server."""
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


async def count_calls(args: argparse.Namespace, name: str, pid: int, call: Call, out: Path) -> tuple[float, int, float]:
    """Count ``call`` on the server ``pid``, running under callgrind (its files at ``out``): ``args.warmup`` calls
    uninstrumented, instrumentation on, ``args.warmup`` more, the counters zeroed, ``args.calls`` calls at
    ``args.concurrency`` in flight, the counters dumped, instrumentation off. Returns the instructions per call, the
    calls that failed (those ``--max-seconds`` left unmade too) and the seconds it took."""

    async def calls(count: int) -> int:
        made = await measure(name, call, concurrency=args.concurrency, calls=count, max_seconds=args.max_seconds,
                             server_pid=pid)
        for text, times in made.failure_samples.items():
            progress(f"      FAILURE x{times}: {text}")
        return made.failures + (count - made.calls - made.failures)

    started = time.monotonic()
    failures = await calls(args.warmup)
    callgrind(pid, "-i", "on")
    failures += await calls(args.warmup)
    callgrind(pid, "-z")
    failures += await calls(args.calls)
    callgrind(pid, "-d")
    callgrind(pid, "-i", "off")
    return dumped_instructions(out) / args.calls, failures, time.monotonic() - started


def under_callgrind(out: Path) -> list[str]:
    """The command that runs a server under callgrind, instrumentation off until switched on, its files at ``out``."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


async def count_server(args: argparse.Namespace, children: Children, name: str, target: str, arguments: str, *,
                       check_result: bool) -> dict[str, Any]:
    """Count the calls of ``arguments`` on the running child ``name``: its first reply must be a success (the
    sidecar's is kept as the echo's reply), then ``count_calls``."""
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS))
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ToolServiceStub(channel)
        reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        if reply.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"{name}: the first reply is not a success: {reply}")
        if not (children.tmp / REPLY).exists():
            (children.tmp / REPLY).write_bytes(reply.SerializeToString())
        call = call_of(arguments, stub, request, reply.data_json, check_result=check_result)
        instructions, failures, seconds = await count_calls(args, name, children.procs[name].pid, call,
                                                            children.tmp / f"{name}.callgrind")
    progress(f"  {name:<24} {instructions / 1000:9.1f} k instructions per call  ({failures} failures, {seconds:.0f} s)")
    return {"instructions_per_call": instructions, "failures": failures, "seconds": seconds}


async def counted_sidecar(args: argparse.Namespace, children: Children, variant: Variant, arguments: str,
                          rep: int) -> dict[str, Any]:
    """One count of ``variant``'s sidecar (started here, under callgrind, and stopped)."""
    run = replace(variant, name=f"{variant.name}.{arguments}.{rep}", env=dict(variant.env))
    if run.wants_sink:
        (children.tmp / run.name).mkdir()
        await start_sink(children, run)
    target = start_sidecar(children, run, wrapper=under_callgrind(children.tmp / f"{run.name}.callgrind"))
    await wait_ready(children, run.name, target, health_serving, timeout=START_TIMEOUT_S)
    counts = await count_server(args, children, run.name, target, arguments, check_result=True)
    run.calls_sent = 1 + 2 * args.warmup + args.calls
    spans = received_spans(children, run) if run.sink_count else None  # stops the sidecar
    if spans is None:
        stop_child(children, run.name)
    else:
        stop_child(children, f"{run.name}-sink")
    return {**counts, "spans_per_call": None if spans is None else spans / run.calls_sent,
            "log_problems": children.log_problems(run.name)}


async def counted_echo(args: argparse.Namespace, children: Children, arguments: str, rep: int) -> dict[str, Any]:
    """One count of the bare grpcio echo server (``bench_execute.py --echo-server``, started here under callgrind and
    stopped), answering with the bytes of a sidecar's first reply."""
    name = f"{ECHO}.{arguments}.{rep}"
    if not (children.tmp / REPLY).exists():
        raise RuntimeError("the echo needs a sidecar's reply: count a sidecar config first")
    target = f"unix://{children.tmp / f'{name}.sock'}"
    children.start(name, [*under_callgrind(children.tmp / f"{name}.callgrind"), sys.executable,
                          str(HERE / "bench_execute.py"), "--echo-server", target, str(children.tmp / REPLY)],
                   pdeathsig=True)
    progress(f"{name}: pid {children.procs[name].pid}, {target}")
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS))
    await wait_ready(children, name, target, answers(request), timeout=START_TIMEOUT_S)
    counts = await count_server(args, children, name, target, arguments, check_result=False)
    stop_child(children, name)
    return {**counts, "spans_per_call": None, "log_problems": children.log_problems(name)}


async def counted_mode(args: argparse.Namespace, children: Children, arguments: str) -> list[dict[str, Any]]:
    """Every config counted ``args.repeat`` times with ``arguments``, alternating their order; each config's
    medians and its ratios to the baseline and to the echo."""
    variants: list[Variant] = args.variants
    names = [variant.name for variant in variants] + [ECHO]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(1, args.repeat + 1):
        progress(f"{arguments} arguments, run {rep}/{args.repeat}")
        for name in names if rep % 2 else names[::-1]:
            runs[name].append(await counted_echo(args, children, arguments, rep) if name == ECHO else
                              await counted_sidecar(args, children, variants[names.index(name)], arguments, rep))
    per_run = {name: [run["instructions_per_call"] for run in runs[name]] for name in names}
    base, echo = statistics.median(per_run[BASELINE]), statistics.median(per_run[ECHO])
    overlays = {variant.name: (variant.overlay, variant.env) for variant in variants}
    configs = []
    for name in names:
        median = statistics.median(per_run[name])
        spans = [run["spans_per_call"] for run in runs[name] if run["spans_per_call"] is not None]
        overlay, env = overlays.get(name, (None, None))
        configs.append({
            "name": name, "arguments": arguments, "overlay": overlay, "env": env, "instructions_per_call": median,
            "run_instructions_per_call": per_run[name], "ratio": median / base, "echo_ratio": median / echo,
            "run_echo_ratios": [n / e for n, e in zip(per_run[name], per_run[ECHO], strict=True)],
            "spans_per_call": statistics.median(spans) if spans else None,
            "failures": sum(run["failures"] for run in runs[name]),
            "log_problems": [line for run in runs[name] for line in run["log_problems"]], "runs": runs[name]})
    return configs


async def bench(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    configs = [config for arguments in args.arguments for config in await counted_mode(args, children, arguments)]
    return {
        "benchmark": f"instructions per ExecuteTool {TOOL} at {args.concurrency} in flight (callgrind): variants vs "
                     "the baseline config and the bare grpcio echo",
        "environment": {"python": platform.python_version(), "grpcio": grpc.__version__,
                        "platform": platform.platform()},
        "settings": {"calls": args.calls, "warmup": args.warmup, "concurrency": args.concurrency,
                     "repeat": args.repeat, "arguments": args.arguments},
        "configs": configs,
        "failures": sum(config["failures"] for config in configs),
    }


def target_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Issue 27's targets of the baseline sidecar's instructions per call against the echo's, for each argument mode
    counted: (target, figure, ratio, wanted, met)."""
    rows = []
    echo = {config["arguments"]: config for config in results["configs"] if config["name"] == ECHO}
    for config in results["configs"]:
        wanted = TARGET_ECHO_RATIOS.get(config["arguments"])
        if config["name"] == BASELINE and wanted is not None:
            what = "cache hits" if config["arguments"] == "repeated" else "distinct arguments"
            rows.append((f"instructions c={results['settings']['concurrency']}, {what} / echo",
                         f"{config['instructions_per_call'] / 1000:.0f}k per call (echo "
                         f"{echo[config['arguments']]['instructions_per_call'] / 1000:.0f}k)",
                         f"{config['echo_ratio']:.2f}", f"<= {wanted}", met(config["echo_ratio"] <= wanted)))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="counted calls per run (default: 1000)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="calls before counting, once uninstrumented and once instrumented (default: 200)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default: 16)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per config; medians reported (default: 1)")
    parser.add_argument("--arguments", default="repeated",
                        help="comma-separated: repeated (add [2, 3] every call: decisions cached after the first) "
                             "and/or distinct (add [2, n], a new n every call: decided anew) (default: repeated)")
    parser.add_argument("--max-seconds", type=float, default=900.0,
                        help="a run stops after this long even if calls remain (default: 900)")
    parser.add_argument("--targets", action="store_true",
                        help="issue 27's targets: --arguments repeated,distinct, the baseline and the echo only "
                             "(unless --variant is given), and a table of the ratios to the echo against them")
    add_variant_arguments(parser)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.calls < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--concurrency, --calls and --repeat must be at least 1, --warmup at least 0")
    args.arguments = list(ARGUMENT_MODES) if args.targets else [x.strip() for x in args.arguments.split(",")
                                                                if x.strip()]
    if not args.arguments or not set(args.arguments) <= set(ARGUMENT_MODES) or len(set(args.arguments)) < len(
            args.arguments):
        parser.error(f"--arguments: expected a comma-separated list of {', '.join(ARGUMENT_MODES)}, each once")
    args.variants = variants_of(args)
    if args.targets and not args.variant:
        args.variants = args.variants[:1]
    if ECHO in (variant.name for variant in args.variants):
        parser.error(f"--variant: {ECHO!r} is the name of the bare grpcio echo server's config")
    require_valgrind(parser)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_with_children(bench, args, what="the servers")
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    for arguments in args.arguments:
        mode = "add [2, 3] every call" if arguments == "repeated" else "add [2, n], a new n every call"
        print(f"\nInstructions per ExecuteTool {TOOL}, {arguments} arguments ({mode}), at {args.concurrency} in "
              f"flight, {args.calls} calls counted per run, medians of {args.repeat} run(s) (callgrind, every thread "
              "of the server)", file=out)
        print(f"{'config':<14}{'k instr/call':>14}{'ratio':>8}{'x echo':>8}{'spans/call':>12}  per run (k)", file=out)
        for config in (config for config in results["configs"] if config["arguments"] == arguments):
            spans = "-" if config["spans_per_call"] is None else f"{config['spans_per_call']:.2f}"
            per_run = ", ".join(f"{count / 1000:.1f}" for count in config["run_instructions_per_call"])
            print(f"{config['name']:<14}{config['instructions_per_call'] / 1000:>14.1f}{config['ratio']:>8.3f}"
                  f"{config['echo_ratio']:>8.3f}{spans:>12}  {per_run}", file=out)
            if config["log_problems"]:
                print(f"  {config['name']} log: {len(config['log_problems'])} error line(s), first: "
                      f"{config['log_problems'][0]}", file=out)
    print(f"ratio = median instructions per call / {BASELINE}'s; x echo = / the bare grpcio echo server's", file=out)
    if args.targets:
        print("\n" + format_rows([TARGET_HEADER, *target_rows(results)]), file=out)
    return finish(results, out, json_out=args.json)

if __name__ == "__main__":
    raise SystemExit(main())
