#!/usr/bin/env python
"""Every performance target of the sidecar in one run: each figure, its ratio and whether it is met.

    python benchmarks/targets.py [--repeat 3] [--calls N]
        [--only execute,list_tools,workers,writes,footprint,instructions,image,soak] [--soak-minutes 60] [--json]

Runs, one after the other and each with ``--json``, the benchmarks that measure the targets:

* ``bench_execute.py --targets``: ExecuteTool at 16 in flight against the bare grpcio echo, with repeated
  arguments (decision cache hits) and distinct ones (misses), and the p99 the sidecar adds at half of its
  peak load;
* ``bench_list_tools.py``: ListTools with 200 tools (p50 over gRPC), and the CPU per listing and per call
  with 200 tools against the installed ones (flat: at most ``FLAT`` times);
* ``bench_workers.py``: ``server.workers: 2`` against the echo over loopback TCP;
* ``bench_writes.py``: keyed writes on SQLite, through one sidecar on PostgreSQL and through two sharing
  it, each run checked for exactly-once and a verified audit chain;
* ``bench_footprint.py``: idle RSS and start to SERVING of the real ``serve``, with the defaults and with RS256
  JWT auth and metrics on, against a bare ``import grpc`` process;
* ``bench_instructions.py --targets``: the instructions per call of the sidecar at 16 in flight against the bare
  grpcio echo's, both counted under callgrind, with repeated arguments (cache hits) and distinct ones (needs
  ``valgrind``; the slowest of them: about a minute per run of 1000 calls, four runs per repetition);
* ``bench_image.py``: the image's size, built from the Dockerfile with buildah on the Debian 12 builder base
  ``bash .ci/image-tools`` makes (as root); the runtime has no base, so it is the default build's size (one build,
  a minute or two, given neither ``--repeat`` nor ``--calls``);
* ``soak.py``: RSS after ``--soak-minutes`` (default 60, the target's hour) at half of the peak load against idle
  RSS (one run, whatever ``--repeat`` and ``--calls`` say; it fails if its own checks of the run fail).

and prints one table. Each benchmark keeps its own medians of ``--repeat`` runs, measured against its
baseline within the same run; their own tables go to stderr as they run. The exit code is 1 if a benchmark
failed (a wrong reply, a failed exactly-once or chain check), 0 otherwise — an unmet target is reported,
not an error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_execute import TARGET_HEADER, format_rows, met, target_rows
from bench_footprint import target_rows as footprint_rows
from bench_image import target_rows as image_rows
from bench_instructions import target_rows as instruction_rows
from soak import target_rows as soak_rows

HERE = Path(__file__).resolve().parent
TARGET_LIST_P50_MS = 2.0
TARGET_WORKERS_RATIO = 0.9
TARGET_SQLITE_WRITES = 600.0
TARGET_PG2_WRITES = 500.0
TARGET_PG_SCALING = 1.5
FLAT = 1.25  # "per-call cost flat in the number of installed tools": 200 tools cost at most this much more

Row = tuple[str, str, str, str, str]


def list_tools_rows(results: dict[str, Any]) -> list[Row]:
    many, listing = results["tools"]["many"], results["list"]
    p50 = listing["many"]["p50_ms"]
    rows: list[Row] = [(f"ListTools, {many} tools, p50 over gRPC", f"{p50:.2f} ms",
                        f"{p50 / TARGET_LIST_P50_MS:.2f} of target", f"<= {TARGET_LIST_P50_MS} ms",
                        met(p50 <= TARGET_LIST_P50_MS))]
    for what, label in (("list", "ListTools"), ("execute", "ExecuteTool")):
        ratios = sorted(results[what]["run_ratios"])
        ratio = ratios[len(ratios) // 2] if ratios else float("nan")
        cpu = results[what]["many"]["server_cpu_ms_per_call"]
        rows.append((f"{label} CPU, {many} tools / installed", f"{cpu or 0:.3f} ms per call", f"{ratio:.2f}",
                     f"<= {FLAT}", met(ratio <= FLAT)))
    return rows


def workers_rows(results: dict[str, Any]) -> list[Row]:
    ratio, servers = results["ratio"]["workers2"], results["servers"]
    return [("ExecuteTool c=16, server.workers: 2", f"{servers['workers2']['calls_per_s']:.0f} calls/s "
             f"(echo {servers['echo']['calls_per_s']:.0f})", f"{ratio:.2f}", f">= {TARGET_WORKERS_RATIO}",
             met(ratio >= TARGET_WORKERS_RATIO))]


def writes_rows(results: dict[str, Any]) -> list[Row]:
    summary = results["summary"]
    rows: list[Row] = []
    for mode, label, wanted in (("sqlite", "keyed writes, SQLite (synchronous=FULL)", TARGET_SQLITE_WRITES),
                                ("pg2", "keyed writes, two sidecars on PostgreSQL", TARGET_PG2_WRITES)):
        if mode in summary:
            rate = summary[mode]["median_calls_per_s"]
            rows.append((label, f"{rate:.0f} calls/s", f"{rate / wanted:.2f} of target", f">= {wanted:.0f}/s",
                         met(rate >= wanted)))
    if "ratio_pg2_pg1" in summary:
        ratio = summary["ratio_pg2_pg1"]["median"]
        rows.append(("keyed writes, two sidecars / one", f"{summary['pg1']['median_calls_per_s']:.0f} -> "
                     f"{summary['pg2']['median_calls_per_s']:.0f} calls/s", f"{ratio:.2f}", f">= {TARGET_PG_SCALING}",
                     met(ratio >= TARGET_PG_SCALING)))
    return rows


Sizing = Callable[[argparse.Namespace], list[str]]  # the arguments that size a benchmark's run, from targets.py's


def repeated(args: argparse.Namespace) -> list[str]:
    """``--repeat`` and ``--calls`` as given to targets.py."""
    return ["--repeat", str(args.repeat), *(["--calls", str(args.calls)] if args.calls is not None else [])]


def one_build(args: argparse.Namespace) -> list[str]:
    """Nothing: one build of the image, whatever targets.py was given."""
    return []


def soak_length(args: argparse.Namespace) -> list[str]:
    """One soak of ``--soak-minutes``."""
    return ["--minutes", f"{args.soak_minutes:g}"]


# name: (script, its own arguments, its sizing, the rows of its JSON document)
BENCHMARKS: dict[str, tuple[str, tuple[str, ...], Sizing, Callable[[dict[str, Any]], list[Row]]]] = {
    "execute": ("bench_execute.py", ("--targets",), repeated, target_rows),
    "list_tools": ("bench_list_tools.py", (), repeated, list_tools_rows),
    "workers": ("bench_workers.py", (), repeated, workers_rows),
    "writes": ("bench_writes.py", (), repeated, writes_rows),
    "footprint": ("bench_footprint.py", (), repeated, footprint_rows),
    "instructions": ("bench_instructions.py", ("--targets",), repeated, instruction_rows),
    "image": ("bench_image.py", (), one_build, image_rows),
    "soak": ("soak.py", (), soak_length, soak_rows),
}


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One benchmark's JSON document; its tables and progress go through to stderr."""
    script, own, sizing, _ = BENCHMARKS[name]
    sized = sizing(args)
    done = subprocess.run([sys.executable, str(HERE / script), *own, *sized, "--json"],
                          stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{script} exited with {done.returncode}")
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (default 3)")
    parser.add_argument("--calls", type=int, default=None, help="measured calls per run (default: each's own)")
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help=f"comma-separated, of {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--soak-minutes", type=float, default=60.0,
                        help="the soak's paced phase, in minutes (default 60: the target's hour)")
    parser.add_argument("--json", action="store_true", help="the rows and each benchmark's document on stdout")
    args = parser.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    if unknown := sorted(set(args.only) - set(BENCHMARKS)):
        parser.error(f"--only: unknown benchmark(s) {unknown}: choose from {', '.join(BENCHMARKS)}")
    if args.soak_minutes <= 0:
        parser.error("--soak-minutes must be more than 0")
    if args.repeat < 1 or (args.calls is not None and args.calls < 1):
        parser.error("--repeat and --calls must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    documents: dict[str, dict[str, Any]] = {}
    rows: list[Row] = []
    failed: list[str] = []
    for name in args.only:
        try:
            documents[name] = run(name, args)
        except (RuntimeError, json.JSONDecodeError) as exc:
            failed.append(f"{name}: {exc}")
            continue
        rows.extend(BENCHMARKS[name][3](documents[name]))
    out = sys.stderr if args.json else sys.stdout
    print(f"\nperformance targets; medians of {args.repeat} runs; {os.cpu_count()} CPUs shared by clients and "
          f"servers; load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=out)
    print(format_rows([TARGET_HEADER, *rows]), file=out)
    for problem in failed:
        print(f"FAILED {problem}", file=out)
    if args.json:
        print(json.dumps({"rows": [dict(zip(TARGET_HEADER, row, strict=True)) for row in rows],
                          "benchmarks": documents, "failed": failed}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
