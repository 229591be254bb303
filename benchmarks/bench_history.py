#!/usr/bin/env python
"""What a call's history costs: instructions per ExecuteTool (callgrind) on a policy set that reads no history and
on the same set reading a meter and the conversation's labels.

    python benchmarks/bench_history.py [--calls N] [--warmup N] [--concurrency 16] [--repeat 3]
        [--configs none,meter+labels[,meter][,labels][,meter+labels:SECONDS][,meter+labels:reached][,bundled]
                   [,bundled+meter][,bundled+meter:reached]]
        [--keep-callgrind DIR] [--json]

Each config is the real sidecar (``bench_execute.py``'s config: dev auth, a fresh SQLite store, the decision cache on)
on a policy directory, counted as ``bench_instructions.py`` counts a variant (its ``callgrind``, its
``dumped_instructions``: start-up uninstrumented, a warm-up uninstrumented and one instrumented, the counters zeroed,
``--calls`` calls at ``--concurrency`` in flight, every reply checked, every thread of the sidecar counted). Every
call is ``calculate`` add [2, 3] in the conversation ``bench-history``. The configs:

``none``
    ``history_policies/none``: availability, authz and approval deciding ``calculate`` as the bundled policies do,
    reading nothing of a call's history (its files never mention the words the sidecar looks for, its data declares
    no meter): the sidecar computes none of it. The baseline of the ratios.
``meter+labels``
    ``history_policies/meter_labels``: the same set, with the meter ``calls_per_principal`` (every call, by
    principal, a 60 s window, a limit of 10^9) and an authz rule that reads it and ``input.conversation.labels``
    (a ``restricted`` label refuses; the limit reached rate-limits). So each call reserves its place on the meter (a
    locked transaction in the store), reads its conversation (a query), runs, keeps its place, and its authz and
    approval decisions, whose input now carries a count that changes with every call, are evaluated anew.
``meter``, ``labels``
    ``history_policies/meter`` and ``history_policies/labels``: the same set reading only the meter (its data
    declares it, its authz reads it) or only the labels (no meter): what each of the two costs.
``meter+labels:reached``, ``meter:reached``, ``bundled+meter:reached``
    the same with the meter declared ``"facts": "reached"`` (a copy of the directory): below its limit the input
    shows only ``{"reached": false}``, the same for every call, so the decisions that read it stay cached; the call
    still takes its place on the meter in the store.
``meter+labels:SECONDS``, ``meter:SECONDS``
    the same with the meter's window set to ``SECONDS`` (a copy of the directory): the meter's count is the calls of
    its window, which its transaction counts row by row, so this tells the cost of the count from the rest.
``bundled``, ``bundled+meter`` (informational)
    the bundled default policies as they are (they read labels and failures; their meter counts writes, not
    ``calculate``), and with ``calls_per_principal`` added to their data (their authz enforces any meter's limit).

It prints the instructions per call of each config (the median of ``--repeat`` runs; the configs alternate in
order from one repetition to the next), the ratio of the medians to the first config's, and the median of the
per-repetition ratios. After each run the sidecar is stopped and its store read: how many calls its meter counted
(every call made, when a meter counts it: anything else is a failure) and the count the counted calls saw on
average (the calls of the window before each). Needs ``valgrind``; a run of 1000 calls takes one to two minutes.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from bench_execute import (
    ARGUMENT_MODES,
    ARGUMENTS,
    CALL_TIMEOUT_S,
    TOOL,
    Children,
    call_of,
    finish,
    health_serving,
    progress,
    run_with_children,
    wait_ready,
)
from bench_instructions import START_TIMEOUT_S, count_calls, require_valgrind, under_callgrind
from bench_observability import Variant, start_sidecar, stop_child

import sidecar
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

HERE = Path(__file__).resolve().parent
POLICIES = HERE / "history_policies"
CONVERSATION = "bench-history"
METER = "calls_per_principal"
BENCH_METER = {"by": ["principal"], "window_seconds": 60, "limit": 1_000_000_000}  # added to the bundled set
KINDS = ("none", "meter+labels", "meter", "labels", "bundled", "bundled+meter")
DIRECTORIES = {"none": "none", "meter+labels": "meter_labels", "meter": "meter", "labels": "labels"}
DEFAULT_CONFIGS = "none,meter+labels"


@dataclass(frozen=True)
class Config:
    """One config measured: a policy directory, made ready in the run's temporary directory where needed."""

    name: str
    kind: str
    window_seconds: int | None = None  # ``meter+labels:SECONDS``, ``meter:SECONDS``
    reached: bool = False  # ``meter+labels:reached``, ``meter:reached``, ``bundled+meter:reached``

    @property
    def meters(self) -> bool:
        """Whether a meter counts the benchmark's calls."""
        return self.kind in ("meter+labels", "meter", "bundled+meter")

    def policy_dir(self, tmp: Path) -> Path:
        """The directory of its policies (copied and edited under ``tmp`` for a window or the bundled meter)."""
        if self.kind in DIRECTORIES and self.window_seconds is None and not self.reached:
            return POLICIES / DIRECTORIES[self.kind]
        if self.kind == "bundled":
            return _bundled()
        source = POLICIES / DIRECTORIES[self.kind] if self.kind in DIRECTORIES else _bundled()
        target = tmp / "policies" / self.name.replace(":", "-")
        if not target.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("*_test.rego"))
            data = json.loads((target / "data.json").read_text())
            meters = data.setdefault("toolbooth", {}).setdefault("history", {}).setdefault("meters", {})
            meters.setdefault(METER, dict(BENCH_METER))
            if self.window_seconds is not None:
                meters[METER]["window_seconds"] = self.window_seconds
            if self.reached:
                meters[METER]["facts"] = "reached"
            (target / "data.json").write_text(json.dumps(data, indent=2))
        return target

    def window(self, tmp: Path) -> int | None:
        """The window of the meter counting the benchmark's calls, if one does."""
        if not self.meters:
            return None
        data = json.loads((self.policy_dir(tmp) / "data.json").read_text())
        return int(data["toolbooth"]["history"]["meters"][METER]["window_seconds"])


def _bundled() -> Path:
    from sidecar.config.base import bundled_policy_dir

    return bundled_policy_dir()


def parse_config(text: str) -> Config:
    kind, colon, modifier = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown config {text!r}: expected one of {', '.join(KINDS)} "
                         "(meter+labels:SECONDS and meter+labels:reached too)")
    if not colon:
        return Config(text, kind)
    if modifier == "reached" and kind in ("meter+labels", "meter", "bundled+meter"):
        return Config(text, kind, reached=True)
    if kind not in ("meter+labels", "meter") or not modifier.isdigit() or int(modifier) < 1:
        raise ValueError(f"{text!r}: only meter+labels and meter take a window, in whole seconds (meter+labels:1); "
                         "they and bundled+meter take :reached")
    return Config(text, kind, int(modifier))


def stored_history(db: Path, window: int | None, counted: int) -> dict[str, Any]:
    """What a stopped sidecar's store holds of its history: the calls its meters counted, the labels, and the count
    the last ``counted`` calls saw on average on a meter of ``window`` seconds (the calls counted in the window
    before each)."""
    with sqlite3.connect(db, timeout=30) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'toolbooth_history'").fetchone():
            return {"table": False, "calls": 0, "labels": 0, "failures": 0, "mean_count_seen": None}
        kinds = dict(conn.execute("SELECT kind, count(*) FROM toolbooth_history GROUP BY kind").fetchall())
        times = [at for (at,) in conn.execute("SELECT at FROM toolbooth_history WHERE kind = 'call' ORDER BY at")]
    seen = None
    if window is not None and times:
        last = range(max(0, len(times) - counted), len(times))
        seen = statistics.fmean(bisect.bisect_left(times, times[i]) - bisect.bisect_right(times, times[i] - window)
                                for i in last)
    return {"table": True, "calls": kinds.get("call", 0), "labels": kinds.get("label", 0),
            "failures": kinds.get("failure", 0), "mean_count_seen": seen}


async def counted(args: argparse.Namespace, children: Children, config: Config, run: int) -> dict[str, Any]:
    """Instructions per call of ``config``'s sidecar, run ``run`` (started, measured, stopped and its store read)."""
    name = f"{config.name.replace(':', '-')}.{run}"
    policy_dir = config.policy_dir(children.tmp)
    variant = Variant(name, {"policy": {"path": str(policy_dir)}})
    out = children.tmp / f"{name}.callgrind"
    target = start_sidecar(children, variant, wrapper=under_callgrind(out))
    await wait_ready(children, name, target, health_serving, timeout=START_TIMEOUT_S)
    pid = children.procs[name].pid
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS), conversation_id=CONVERSATION)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ToolServiceStub(channel)
        reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        if reply.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"{name}: the first reply is not a success: {reply}")
        call = call_of(args.arguments, stub, request, reply.data_json, check_result=True, first=10)
        instructions, failures, seconds = await count_calls(args, name, pid, call, out)
    if args.keep_callgrind is not None:
        for path in out.parent.glob(f"{out.name}*"):
            shutil.copy(path, args.keep_callgrind / path.name)
    code = stop_child(children, name)
    sent = 1 + 2 * args.warmup + args.calls
    history = stored_history(children.tmp / name / "state" / "toolbooth.db", config.window(children.tmp), args.calls)
    expected = sent if config.meters else 0
    if history["calls"] != expected:
        progress(f"      FAILURE: the store's meters counted {history['calls']} calls, not {expected}")
        failures += 1
    seen = "" if history["mean_count_seen"] is None else f", meter count seen {history['mean_count_seen']:.0f}"
    progress(f"  {name:<22} {instructions / 1000:9.1f} k instructions per call  ({failures} failures, "
             f"{seconds:.0f} s{seen})")
    return {"instructions_per_call": instructions, "failures": failures, "seconds": seconds, "history": history,
            "exit_code": code, "log_problems": children.log_problems(name), "policy_path": str(policy_dir)}


async def bench(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    configs: list[Config] = args.configs
    runs: dict[str, list[dict[str, Any]]] = {config.name: [] for config in configs}
    for rep in range(args.repeat):
        progress(f"run {rep + 1}/{args.repeat}")
        for config in configs if rep % 2 == 0 else configs[::-1]:
            runs[config.name].append(await counted(args, children, config, rep + 1))
    base = configs[0].name
    base_median = statistics.median(run["instructions_per_call"] for run in runs[base])
    results = []
    for config in configs:
        counts = [run["instructions_per_call"] for run in runs[config.name]]
        ratios = [run["instructions_per_call"] / b["instructions_per_call"]
                  for run, b in zip(runs[config.name], runs[base], strict=True)]
        seen = [run["history"]["mean_count_seen"] for run in runs[config.name]
                if run["history"]["mean_count_seen"] is not None]
        results.append({
            "name": config.name, "policy_path": runs[config.name][0]["policy_path"], "window_seconds":
            config.window(children.tmp), "instructions_per_call": statistics.median(counts),
            "ratio": statistics.median(counts) / base_median, "run_instructions_per_call": counts,
            "run_ratios": ratios, "run_ratio_median": statistics.median(ratios),
            "mean_count_seen": statistics.median(seen) if seen else None,
            "failures": sum(run["failures"] for run in runs[config.name]),
            "log_problems": [line for run in runs[config.name] for line in run["log_problems"]],
            "runs": runs[config.name]})
    return {
        "benchmark": f"instructions per ExecuteTool {TOOL} add [2,3] at {args.concurrency} in flight (callgrind): "
                     f"a call's history read by the policies vs none ({base})",
        "environment": {"python": platform.python_version(), "grpcio": grpc.__version__,
                        "platform": platform.platform(), "sidecar": str(Path(sidecar.__file__).parent),
                        "revision": _revision(Path(sidecar.__file__).parent)},
        "settings": {"calls": args.calls, "warmup": args.warmup, "concurrency": args.concurrency,
                     "repeat": args.repeat, "conversation_id": CONVERSATION, "arguments": args.arguments},
        "configs": results,
        "failures": sum(config["failures"] for config in results),
    }


def _revision(package: Path) -> str | None:
    """The commit of the sidecar measured, ``+`` when its package has changes not committed (``None``: no git)."""
    try:
        head = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="counted calls per run (default: 1000)")
    parser.add_argument("--warmup", type=int, default=200,
                        help="calls before counting, once uninstrumented and once instrumented (default: 200)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default: 16)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per config; medians reported (default: 1)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated, the first the baseline of the ratios: {', '.join(KINDS)}, "
                             f"meter+labels:SECONDS, meter:SECONDS, meter+labels:reached, meter:reached, "
                             f"bundled+meter:reached (default: {DEFAULT_CONFIGS})")
    parser.add_argument("--max-seconds", type=float, default=900.0,
                        help="a run stops after this long even if calls remain (default: 900)")
    parser.add_argument("--keep-callgrind", type=Path, metavar="DIR",
                        help="copy each run's callgrind files to DIR (for callgrind_annotate)")
    parser.add_argument("--arguments", choices=ARGUMENT_MODES, default="repeated",
                        help="repeated (add [2, 3] every call: decisions that read no history come from the cache) "
                             "or distinct (add [2, n], a new n every call: every decision is made anew) "
                             "(default: repeated)")
    parser.add_argument("--json", action="store_true", help="print a JSON document on stdout (the table: stderr)")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.calls < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--concurrency, --calls and --repeat must be at least 1, --warmup at least 0")
    try:
        args.configs = [parse_config(text.strip()) for text in args.configs.split(",") if text.strip()]
    except ValueError as exc:
        parser.error(f"--configs: {exc}")
    names = [config.name for config in args.configs]
    if not names or len(set(names)) != len(names):
        parser.error("--configs: name one or more configs, each once")
    if args.keep_callgrind is not None:
        args.keep_callgrind.mkdir(parents=True, exist_ok=True)
    require_valgrind(parser)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_with_children(bench, args, what="the sidecars")
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    base = results["configs"][0]["name"]
    print(f"\nInstructions per ExecuteTool {TOOL} {json.dumps(ARGUMENTS)} at {args.concurrency} in flight, "
          f"{args.calls} calls counted per run, medians of {args.repeat} run(s) (callgrind, every thread of the "
          f"sidecar; {results['environment']['sidecar']} at {results['environment']['revision']})", file=out)
    print(f"{'config':<22}{'k instr/call':>14}{'ratio':>8}{'run ratio':>11}{'count seen':>12}  per run (k)", file=out)
    for config in results["configs"]:
        seen = "-" if config["mean_count_seen"] is None else f"{config['mean_count_seen']:.0f}"
        per_run = ", ".join(f"{count / 1000:.1f}" for count in config["run_instructions_per_call"])
        print(f"{config['name']:<22}{config['instructions_per_call'] / 1000:>14.1f}{config['ratio']:>8.3f}"
              f"{config['run_ratio_median']:>11.3f}{seen:>12}  {per_run}", file=out)
        if config["log_problems"]:
            print(f"  {config['name']} log: {len(config['log_problems'])} error line(s), first: "
                  f"{config['log_problems'][0]}", file=out)
    print(f"ratio = median instructions per call / {base}'s; run ratio: the median of the per-repetition ratios; "
          "count seen: what the meter counted before a call, on average (the calls of its window)", file=out)
    return finish(results, out, json_out=args.json)


if __name__ == "__main__":
    raise SystemExit(main())
