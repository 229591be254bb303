"""Policy decision latency: embedded engine, cold and cached, and ListTools with 10 and 200 tools.

    python benchmarks/bench_policy.py [--rounds N] [--json]

Each figure is the median (p50) and p99 of N timed rounds. Baseline, measured in the
same run with the same harness: a policy set whose three rules are constant
(``decision := {"allow": true}``) — the floor of regorus plus the harness, so the
ratio says what the default policies' logic costs on top.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sidecar.bootstrap import assemble
from sidecar.config import Limits, bundled_policy_dir
from sidecar.contract import Principal
from sidecar.plugin import SideEffect, ToolContext, ToolDefinition, tool
from sidecar.policy import CALL_STAGES, PolicyEngine, Stage
from sidecar.policy.cache import CachingEngine
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import CallInput, InputParts, PolicyInput, now_utc, principal_json, tool_json
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry

PRINCIPAL = Principal(id="u-1", tenant="acme", roles=("developer",), permissions=("reports:read",))
CONSTANT = {
    Stage.AVAILABILITY: 'decision := {"allow": true}',
    Stage.AUTHZ: 'decision := {"allow": true}',
    Stage.APPROVAL: 'decision := {"required": false}',
}


class Args(BaseModel):
    text: str = ""


def make_tool(name: str, permissions: tuple[str, ...] = ()) -> ToolDefinition[Any, Any]:
    async def handler(args: Args, ctx: ToolContext) -> Args:
        return args

    return tool(name=name, version="1.0.0", side_effect=SideEffect.NONE, permissions=permissions)(handler)


def constant_policies(root: Path) -> Path:
    for stage, body in CONSTANT.items():
        (root / f"{stage.value}.rego").write_text(f"package toolbooth.{stage.value}\n\nimport rego.v1\n\n{body}\n")
    return root


async def timed(rounds: int, step: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """p50 and p99 in microseconds of ``rounds`` awaited calls (after a warm-up)."""
    for _ in range(min(200, rounds)):
        await step()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        await step()
        samples.append((time.perf_counter_ns() - started) / 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


async def decisions(engine: PolicyEngine, rounds: int, *, cached: bool) -> dict[str, tuple[float, float]]:
    """Per stage latency of ``decide`` alone (inputs are built beforehand). Cold inputs differ every
    round, so a cache could not help; cached ones repeat."""
    defn = make_tool("calculate", ("reports:read",))
    who, what = principal_json(PRINCIPAL), tool_json(defn)

    def inputs(stage: Stage) -> Iterator[PolicyInput]:
        for n in itertools.count():
            conversation = "c-1" if cached else f"c-{n}"
            call = CallInput('{"text":"x"}', conversation, None) if stage is not Stage.AVAILABILITY else None
            yield InputParts(who, what, now_utc(), conversation).build(stage, call)

    results = {}
    for stage in CALL_STAGES:  # the approver rule is decided outside calls, on its own input
        prepared = iter(list(itertools.islice(inputs(stage), rounds + min(200, rounds))))
        results[stage.value] = await timed(rounds, lambda s=stage, it=prepared: engine.decide(s, next(it)))
    return results


async def list_tools(policy: PolicyEngine, tools: int, rounds: int, store: SqliteStore) -> tuple[float, float]:
    registry = Registry.from_tools(make_tool(f"tool_{n:03d}") for n in range(tools))
    pipeline = assemble(registry=registry, policy=policy, store=store, limits=Limits())
    return await timed(rounds, lambda: pipeline.list_tools(PRINCIPAL))


async def run(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        default = EmbeddedEngine.load(bundled_policy_dir())
        constant = EmbeddedEngine.load(constant_policies(Path(tmp)))
        store = await SqliteStore.open(Path(tmp) / "bench.db")
        results: dict[str, Any] = {}
        for label, engine in (("default", default), ("constant", constant)):
            results[f"{label} cold"] = await decisions(engine, rounds, cached=False)
            caching = CachingEngine(engine, max_entries=10_000, ttl_seconds=60)
            results[f"{label} cached"] = await decisions(caching, rounds, cached=True)
            listings = max(rounds // 20, 50)
            for tools in (10, 200):
                cached_engine = CachingEngine(engine, max_entries=10_000, ttl_seconds=60)
                results[f"{label} ListTools {tools} cold"] = await list_tools(engine, tools, listings, store)
                results[f"{label} ListTools {tools} cached"] = await list_tools(cached_engine, tools, listings, store)
        await store.aclose()
        return results


def report(results: dict[str, Any]) -> str:
    lines = ["decision latency, embedded engine (µs)", "stage         default p50/p99    constant p50/p99   ratio"]
    for mode in ("cold", "cached"):
        for stage in CALL_STAGES:
            d50, d99 = results[f"default {mode}"][stage.value]
            c50, c99 = results[f"constant {mode}"][stage.value]
            lines.append(f"{stage.value:12s} {mode:6s} {d50:6.1f} / {d99:6.1f}   "
                         f"{c50:6.1f} / {c99:6.1f}   {d50 / c50:4.2f}")
    lines.append("")
    lines.append("ListTools in-process (µs)       default p50/p99      constant p50/p99     ratio")
    for tools in (10, 200):
        for mode in ("cold", "cached"):
            d50, d99 = results[f"default ListTools {tools} {mode}"]
            c50, c99 = results[f"constant ListTools {tools} {mode}"]
            lines.append(f"{tools:3d} tools {mode:6s}             {d50:8.1f} / {d99:8.1f}  {c50:8.1f} / {c99:8.1f}"
                         f"   {d50 / c50:4.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--json", action="store_true", help="the raw results as JSON on stdout (the table on stderr)")
    args = parser.parse_args()
    results = asyncio.run(run(args.rounds))
    print(report(results), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
