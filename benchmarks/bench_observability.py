#!/usr/bin/env python
"""What observability costs: ExecuteTool calls/s of the real sidecar in a baseline config and in variants.

    python benchmarks/bench_observability.py [--calls N] [--concurrency 16] [--repeat 3]
        [--variant NAME=YAML_OR_FILE ...] [--variant-env NAME=VAR=VALUE ...] [--json]

A variant is a named overlay of the baseline config (bench_execute.py's: dev auth, the bundled policies,
a fresh SQLite file, WARNING logs), given inline as YAML/JSON or as a file, merged key by key; ``$PORT``
in it becomes a free TCP port of 127.0.0.1. ``--variant-env`` sets a variable in that variant's sidecar
process only (``OTEL_TRACES_EXPORTER=console``, say). Without ``--variant`` the variants are
``DEFAULT_VARIANTS``: ``metrics`` (``metrics.listen`` on). Whenever a variant listens for metrics, its
endpoint is scraped once per second while it is measured, as a Prometheus would. A variant that exports
OTLP (``OTEL_TRACES_EXPORTER=otlp``) and names no endpoint of its own gets a sink collector of its own
(otlp_sink.py, a child process; needs the ``otlp`` extra): after the runs its sidecar is stopped, which
flushes the spans still queued, and the spans the sink received are reported per call sent.

In one run it starts one sidecar per config (each in its own process and directory), waits until each
reports SERVING, then for each repetition measures every config back to back (the order alternates),
each run preceded by a warm-up, with bench_execute.py's client (``calculate`` add [2, 3], ``concurrency``
workers). It prints the medians of calls/s, p50, p99 and server CPU per call, and the ratio variant /
baseline of the median calls/s, the median of the per-repetition ratios (steadier on a busy machine) and
the ratio of the server CPU per call. Every reply is checked; failures (and a
metrics endpoint that did not answer, or a sink that received no span) make the exit code 1. See
benchmarks/README.md.
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
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import yaml
from bench_execute import (
    ARGUMENTS,
    CALL_TIMEOUT_S,
    STOP,
    STOP_GRACE_S,
    TOOL,
    Children,
    Interrupted,
    Run,
    free_port,
    grpc_call,
    health_serving,
    measure,
    progress,
    run_with_children,
    summarize,
    wait_ready,
    write_sidecar_config,
)

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

BASELINE = "baseline"
DEFAULT_VARIANTS = {"metrics": "metrics: {listen: '127.0.0.1:$PORT'}"}
SCRAPE_INTERVAL_S = 1.0
SINK = Path(__file__).resolve().with_name("otlp_sink.py")
OTLP_EXPORTERS = ("otlp", "otlp_proto_grpc")  # the entry points of the otlp extra's exporter
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@dataclass
class Variant:
    """One config measured: the baseline or an overlay of it, with its own environment."""

    name: str
    overlay: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    metrics_url: str | None = None  # where it answers scrapes, when it listens for metrics
    sink_count: Path | None = None  # where its OTLP sink counts the spans received, when it has one
    calls_sent: int = 0  # every call made to its sidecar (warm-ups included)

    @property
    def expects_spans(self) -> bool:
        """Whether its sink must receive spans: unless its sampler drops every trace."""
        return self.env.get("OTEL_TRACES_SAMPLER", "").strip() != "always_off"

    @property
    def wants_sink(self) -> bool:
        """Whether it exports OTLP to no endpoint of its own: then it gets a sink."""
        exporters = {name.strip() for name in self.env.get("OTEL_TRACES_EXPORTER", "").split(",")}
        return bool(exporters & set(OTLP_EXPORTERS)) and not any(name in self.env for name in ENDPOINTS)


@dataclass
class Scrapes:
    """What the scraper of one run saw."""

    ok: int = 0
    failed: int = 0
    last: str = ""


def merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay`` merged in, mapping by mapping (any other value replaces)."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_overlay(name: str, text: str) -> dict[str, Any]:
    """``text`` (inline YAML/JSON, or the path of a file holding it) as a mapping, ``$PORT`` a free port."""
    path = Path(text)
    with contextlib.suppress(OSError):
        if path.is_file():
            text = path.read_text()
    text = text.replace("$PORT", str(free_port()))
    try:
        overlay = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SystemExit(f"--variant {name}: not YAML: {exc}") from None
    if not isinstance(overlay, dict):
        raise SystemExit(f"--variant {name}: expected a mapping of config sections, got {overlay!r}")
    return overlay


def variants_of(args: argparse.Namespace) -> list[Variant]:
    """The baseline, then the variants of ``--variant`` (or ``DEFAULT_VARIANTS``), with their ``--variant-env``."""
    given = dict(_pairs(args.variant, "--variant")) or DEFAULT_VARIANTS
    if BASELINE in given:
        raise SystemExit(f"--variant: {BASELINE!r} is the name of the config every variant is compared with")
    variants = [Variant(BASELINE, {})] + [Variant(name, read_overlay(name, text)) for name, text in given.items()]
    by_name = {variant.name: variant for variant in variants}
    for name, assignment in _pairs(args.variant_env, "--variant-env"):
        variable, equals, value = assignment.partition("=")
        if name not in by_name or not equals or not variable:
            raise SystemExit(f"--variant-env {name}={assignment}: expected NAME=VAR=VALUE for a variant NAME "
                             f"({', '.join(by_name)})")
        by_name[name].env[variable] = value
    return variants


def _pairs(items: list[str], flag: str) -> Iterator[tuple[str, str]]:
    for item in items:
        name, equals, rest = item.partition("=")
        if not equals or not name:
            raise SystemExit(f"{flag} {item!r}: expected NAME=...")
        yield name, rest


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` set while the body runs (a child started then inherits it)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


async def start_sink(children: Children, variant: Variant) -> None:
    """Start an OTLP sink for ``variant`` and point its exporter there, once the sink listens."""
    home = children.tmp / variant.name
    address, count = f"127.0.0.1:{free_port()}", home / "spans"
    name = f"{variant.name}-sink"
    proc = children.start(name, [sys.executable, str(SINK), address, str(count)], pdeathsig=True)
    deadline = time.monotonic() + 30
    while read_count(count) is None:
        children.check_alive(name)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not listening after 30 s:\n{children.log_tail(name)}")
        await asyncio.sleep(0.05)
    variant.env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://{address}"
    variant.sink_count = count
    progress(f"{name}: pid {proc.pid}, OTLP/gRPC on {address}")


def read_count(count_file: Path) -> int | None:
    """The spans a sink has received so far (otlp_sink.py writes the file); ``None`` before it listens."""
    try:
        return int(count_file.read_text())
    except FileNotFoundError:
        return None


def stop_child(children: Children, name: str) -> int | None:
    """SIGTERM child ``name`` and wait for it (a sidecar flushes its queued spans first); its exit code."""
    proc = children.procs[name]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def start_sidecar(children: Children, variant: Variant, *, wrapper: Sequence[str] = ()) -> str:
    """Start ``variant``'s sidecar in its own directory (under ``wrapper``, a command that runs it: valgrind, say);
    its gRPC target."""
    home = children.tmp / variant.name
    home.mkdir(exist_ok=True)
    sock = home / "sidecar.sock"
    base = json.loads(write_sidecar_config(home, sock, decision_cache=True).read_text())
    config = merged(base, variant.overlay)
    listen = config.get("metrics", {}).get("listen")
    variant.metrics_url = None if listen is None else f"http://{listen}/metrics"
    path = home / "sidecar.yaml"
    path.write_text(json.dumps(config, indent=2))
    with environment(variant.env):
        proc = children.start(variant.name, [*wrapper, sys.executable, "-m", "sidecar", "serve", "--config",
                                             str(path)], pdeathsig=True)
    extra = f", metrics {variant.metrics_url}" if variant.metrics_url else ""
    env = f", env {' '.join(f'{k}={v}' for k, v in variant.env.items())}" if variant.env else ""
    progress(f"{variant.name}: pid {proc.pid}, unix://{sock}{extra}{env}")
    return f"unix://{sock}"


async def scrape_every(url: str, seen: Scrapes, stop: asyncio.Event) -> None:
    """GET ``url`` every ``SCRAPE_INTERVAL_S`` until ``stop``, as a Prometheus server would."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while not stop.is_set():
            try:
                async with http.get(url) as response:
                    seen.last = await response.text()
                    if response.status == 200:
                        seen.ok += 1
                    else:
                        seen.failed += 1
            except (aiohttp.ClientError, TimeoutError):
                seen.failed += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SCRAPE_INTERVAL_S)


async def measured(variant: Variant, run: Any) -> tuple[Run, Scrapes]:
    """``run()`` (one measured run), with the variant's metrics scraped meanwhile when it has them."""
    seen, stop = Scrapes(), asyncio.Event()
    scraper = None if variant.metrics_url is None else asyncio.create_task(scrape_every(variant.metrics_url, seen,
                                                                                        stop))
    try:
        return await run(), seen
    finally:
        stop.set()
        if scraper is not None:
            await scraper


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """``--variant``, ``--variant-env`` and ``--json``, as this benchmark and ``bench_instructions.py`` take them."""
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=YAML_OR_FILE",
                        help="a config overlay to compare with the baseline (repeatable; default: "
                             f"{'; '.join(f'{k}={v}' for k, v in DEFAULT_VARIANTS.items())})")
    parser.add_argument("--variant-env", action="append", default=[], metavar="NAME=VAR=VALUE",
                        help="an environment variable of variant NAME's sidecar (repeatable)")
    parser.add_argument("--json", action="store_true", help="print a JSON document on stdout (the table: stderr)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=4000, help="measured calls per run (default: 4000)")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured calls before each run (default: 300)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default: 16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per config; medians reported (default: 3)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="a run stops after this long even if calls remain (default: 30)")
    add_variant_arguments(parser)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.calls < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("--concurrency, --calls and --repeat must be at least 1, --warmup at least 0")
    args.variants = variants_of(args)
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


async def _bench(args: argparse.Namespace, children: Children, stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    variants: list[Variant] = args.variants
    request = pb.ExecuteToolRequest(tool=TOOL, arguments_json=json.dumps(ARGUMENTS))
    for variant in variants:
        if variant.wants_sink:
            (children.tmp / variant.name).mkdir()
            await start_sink(children, variant)
    targets = {variant.name: start_sidecar(children, variant) for variant in variants}  # before any channel
    calls = {}
    for variant in variants:
        await wait_ready(children, variant.name, targets[variant.name], health_serving)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(targets[variant.name]))
        stub = pb_grpc.ToolServiceStub(channel)
        reply = await stub.ExecuteTool(request, timeout=CALL_TIMEOUT_S)
        if reply.status != pb.STATUS_SUCCESS:
            raise RuntimeError(f"{variant.name}: the first reply is not a success: {reply}")
        calls[variant.name] = grpc_call(stub, request, reply.data_json)
        variant.calls_sent += 1
    progress(f"{args.warmup} warm-up + {args.calls} calls per run at {args.concurrency} in flight, "
             f"{args.repeat} runs per config")

    runs: dict[str, list[Run]] = {variant.name: [] for variant in variants}
    scrapes: dict[str, Scrapes] = {variant.name: Scrapes() for variant in variants}
    for rep in range(args.repeat):
        for variant in variants if rep % 2 == 0 else variants[::-1]:
            children.check_alive(variant.name)
            pid, call = children.procs[variant.name].pid, calls[variant.name]
            if args.warmup:
                await measure(variant.name, call, concurrency=args.concurrency, calls=args.warmup,
                              max_seconds=args.max_seconds, server_pid=pid)
            started = time.monotonic()
            run, seen = await measured(variant, lambda pid=pid, call=call, name=variant.name: measure(
                name, call, concurrency=args.concurrency, calls=args.calls, max_seconds=args.max_seconds,
                server_pid=pid))
            total = scrapes[variant.name]
            total.ok, total.failed, total.last = total.ok + seen.ok, total.failed + seen.failed, seen.last or total.last
            runs[variant.name].append(run)
            variant.calls_sent += args.warmup + run.calls + run.failures
            cpu = "" if run.server_cpu_ms_per_call is None else f"  server cpu {run.server_cpu_ms_per_call:.3f} ms"
            scraped = f"  {seen.ok} scrapes" if variant.metrics_url else ""
            progress(f"  run {rep + 1}/{args.repeat} {variant.name:<10} {run.calls_per_s:8.0f} calls/s  "
                     f"p50 {run.p50_ms:7.2f} ms  p99 {run.p99_ms:7.2f} ms{cpu}{scraped}  {run.calls} calls in "
                     f"{time.monotonic() - started:.1f} s, {run.failures} failures"
                     f"{' (stopped by --max-seconds)' if run.stopped_by_time else ''}")
            for text, count in run.failure_samples.items():
                progress(f"      FAILURE x{count}: {text}")
    spans = {variant.name: received_spans(children, variant) for variant in variants if variant.sink_count}
    return report(args, variants, runs, scrapes, spans, children)


def received_spans(children: Children, variant: Variant) -> int:
    """The spans ``variant``'s sink received by the time its sidecar, stopped, flushed the rest."""
    assert variant.sink_count is not None
    code = stop_child(children, variant.name)
    if code != 0:
        progress(f"{variant.name}: the sidecar exited with {code} when stopped")
    received = read_count(variant.sink_count) or 0
    progress(f"{variant.name}: {received} spans received for {variant.calls_sent} calls")
    return received


def report(args: argparse.Namespace, variants: list[Variant], runs: dict[str, list[Run]],
           scrapes: dict[str, Scrapes], spans: dict[str, int], children: Children) -> dict[str, Any]:
    base = summarize(runs[BASELINE])
    configs = []
    for variant in variants:
        summary = summarize(runs[variant.name])
        seen = scrapes[variant.name]
        run_ratios = [r.calls_per_s / b.calls_per_s for r, b in zip(runs[variant.name], runs[BASELINE], strict=True)]
        cpu, base_cpu = summary["server_cpu_ms_per_call"], base["server_cpu_ms_per_call"]
        configs.append({
            "name": variant.name, "overlay": variant.overlay, "env": variant.env, **summary,
            "ratio": summary["calls_per_s"] / base["calls_per_s"],
            "run_ratios": run_ratios, "run_ratio_median": statistics.median(run_ratios),
            "cpu_ratio": None if cpu is None or not base_cpu else cpu / base_cpu,
            "scrapes": {"ok": seen.ok, "failed": seen.failed,
                        "counted_calls": _counted_calls(seen.last)} if variant.metrics_url else None,
            "spans": {"received": spans[variant.name], "calls": variant.calls_sent, "expected": variant.expects_spans,
                      "per_call": spans[variant.name] / variant.calls_sent} if variant.name in spans else None,
            "log_problems": children.log_problems(variant.name),
        })
    scrape_failures = sum(c["scrapes"]["failed"] + (c["scrapes"]["ok"] == 0) for c in configs if c["scrapes"])
    sink_failures = sum(c["spans"]["expected"] and not c["spans"]["received"] for c in configs if c["spans"])
    return {
        "benchmark": f"ExecuteTool {TOOL} add [2,3] at {args.concurrency} in flight: variants vs the baseline config",
        "environment": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
                        "platform": platform.platform(), "note": "the client and every sidecar share the CPUs"},
        "settings": {"calls": args.calls, "warmup": args.warmup, "repeat": args.repeat,
                     "max_seconds": args.max_seconds, "concurrency": args.concurrency},
        "configs": configs,
        "failures": sum(c["failures"] for c in configs),
        "scrape_failures": scrape_failures,
        "sink_failures": sink_failures,
    }


def _counted_calls(exposition: str) -> float:
    """The calls the last scrape counted (all ``toolbooth_tool_calls_total`` samples): shows metrics were on."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(exposition)
               for sample in family.samples if sample.name == "toolbooth_tool_calls_total")


def format_table(configs: list[dict[str, Any]]) -> str:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    header = ("config", "calls/s", "ratio", "run ratio", "p50", "p99", "server cpu ms/call", "cpu ratio",
              "per-run ratios", "scrapes", "spans/call")
    rows = [header]
    for c in configs:
        scraped = "-" if c["scrapes"] is None else f"{c['scrapes']['ok']} ok, {c['scrapes']['failed']} failed"
        spans = "-" if c["spans"] is None else f"{c['spans']['per_call']:.2f}"
        cpu_ratio = "n/a" if c["cpu_ratio"] is None else f"{c['cpu_ratio']:.3f}"
        rows.append((c["name"], f"{c['calls_per_s']:.0f}", f"{c['ratio']:.3f}", f"{c['run_ratio_median']:.3f}",
                     f"{c['p50_ms']:.2f} ms", f"{c['p99_ms']:.2f} ms", ms(c["server_cpu_ms_per_call"]), cpu_ratio,
                     ", ".join(f"{x:.3f}" for x in c["run_ratios"]), scraped, spans))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_with_children(bench, args, what="the sidecars")
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    print(f"\nExecuteTool {TOOL} {json.dumps(ARGUMENTS)} at {args.concurrency} in flight; medians of {args.repeat} "
          f"runs of {args.calls} calls; {os.cpu_count()} CPUs shared by the client and the sidecars", file=out)
    print(format_table(results["configs"]), file=out)
    print("ratio = config calls/s / baseline calls/s (medians); 1.0: the variant costs nothing; run ratio: the median "
          "of the per-run ratios (each against the baseline's run of the same repetition); cpu ratio: server CPU per "
          "call / the baseline's (medians); spans/call: what its OTLP sink received per call sent (warm-ups "
          "included)", file=out)
    for config in results["configs"]:
        if config["log_problems"]:
            print(f"{config['name']} log: {len(config['log_problems'])} error line(s), first: "
                  f"{config['log_problems'][0]}", file=out)
        if config["scrapes"] and not config["scrapes"]["counted_calls"]:
            print(f"{config['name']}: the last scrape counted no tool calls", file=out)
        if config["spans"] and config["spans"]["expected"] and not config["spans"]["received"]:
            print(f"{config['name']}: its OTLP sink received no span", file=out)
    failed = results["failures"] or results["scrape_failures"] or results["sink_failures"]
    if failed:
        print(f"FAILURES: {results['failures']} calls, {results['scrape_failures']} scrapes, "
              f"{results['sink_failures']} sinks", file=out)
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
