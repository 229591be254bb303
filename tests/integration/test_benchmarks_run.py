"""The benchmarks still run on today's code (a smoke run with tiny counts; nothing here is timed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", [
    ["benchmarks/bench_policy.py", "--rounds", "20", "--json"],
    ["benchmarks/bench_execute.py", "--calls", "40", "--warmup", "5", "--concurrency", "2", "--repeat", "1", "--json"],
    ["benchmarks/bench_execute.py", "--calls", "40", "--warmup", "5", "--repeat", "1", "--targets",
     "--half-peak-seconds", "0.2", "--json"],
    ["benchmarks/bench_list_tools.py", "--tools", "30", "--calls", "20", "--warmup", "2", "--concurrency", "2",
     "--repeat", "1", "--json"],
    ["benchmarks/bench_batch.py", "--calls", "32", "--warmup", "8", "--batch-size", "4", "--repeat", "1", "--json"],
    ["benchmarks/bench_mcp.py", "--calls", "20", "--warmup", "2", "--concurrency", "2", "--repeat", "1", "--json"],
    ["benchmarks/bench_observability.py", "--calls", "40", "--warmup", "5", "--concurrency", "2", "--repeat", "1",
     "--variant", "metrics=metrics: {listen: '127.0.0.1:$PORT'}",
     "--variant", "nocache=policy: {cache: {enabled: false}}", "--variant-env", "nocache=TOOLBOOTH_TEST_UNUSED=1",
     "--json"],
], ids=["bench_policy", "bench_execute", "bench_execute_targets", "bench_list_tools", "bench_batch", "bench_mcp",
        "bench_observability"])
def test_a_benchmark_runs_to_its_report(command: list[str]) -> None:
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report, "an empty report"


def test_a_bad_arguments_mode_is_refused() -> None:
    done = subprocess.run([sys.executable, "benchmarks/bench_execute.py", "--arguments", "repeated,random"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--arguments: expected a comma-separated list of repeated, distinct" in done.stderr
