"""The benchmarks still run on today's code (a smoke run with tiny counts; nothing here is timed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", [
    ["benchmarks/bench_policy.py", "--rounds", "20", "--json"],
    ["benchmarks/bench_execute.py", "--calls", "40", "--warmup", "5", "--concurrency", "2", "--repeat", "1", "--json"],
    ["benchmarks/bench_list_tools.py", "--tools", "30", "--calls", "20", "--warmup", "2", "--concurrency", "2",
     "--repeat", "1", "--json"],
    ["benchmarks/bench_workers.py", "--calls", "40", "--warmup", "5", "--channels", "4", "--repeat", "1", "--json"],
    ["benchmarks/bench_transport.py", "--calls", "40", "--warmup", "5", "--concurrency", "2", "--threads", "2",
     "--repeat", "1", "--json"],
    ["benchmarks/bench_batch.py", "--calls", "32", "--warmup", "8", "--batch-size", "4", "--repeat", "1", "--json"],
    ["benchmarks/bench_mcp.py", "--calls", "20", "--warmup", "2", "--concurrency", "2", "--repeat", "1", "--json"],
    ["benchmarks/bench_observability.py", "--calls", "40", "--warmup", "5", "--concurrency", "2", "--repeat", "1",
     "--variant", "metrics=metrics: {listen: '127.0.0.1:$PORT'}",
     "--variant", "nocache=policy: {cache: {enabled: false}}", "--variant-env", "nocache=TOOLBOOTH_TEST_UNUSED=1",
     "--json"],
    ["benchmarks/bench_footprint.py", "--repeat", "1", "--calls", "1", "--idle-seconds", "0", "--json"],
], ids=["bench_policy", "bench_execute", "bench_list_tools", "bench_workers",
        "bench_transport", "bench_batch", "bench_mcp", "bench_observability", "bench_footprint"])
@pytest.mark.slow
def test_a_benchmark_runs_to_its_report(command: list[str]) -> None:
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report, "an empty report"


def target_table(report: str) -> dict[str, list[str]]:
    """The last target table of a benchmark's report: each row's figure, ratio, wanted and met, by target."""
    lines = report.splitlines()
    header = max(i for i, line in enumerate(lines) if line.split()[:2] == ["target", "figure"])
    table = {}
    for line in lines[header + 2:]:  # the rule under the header, then the rows
        cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
        if len(cells) != 5:
            break
        table[cells[0]] = cells[1:]
    return table


@pytest.mark.slow
def test_the_execute_benchmarks_targets_run_measures_each_of_its_targets() -> None:
    command = ["benchmarks/bench_execute.py", "--calls", "40", "--warmup", "5", "--repeat", "1", "--targets",
               "--half-peak-seconds", "0.2", "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout)
    assert [(level["concurrency"], level["arguments"]) for level in document["levels"]] == [
        (1, "repeated"), (16, "repeated"), (1, "distinct"), (16, "distinct")]
    assert document["half_peak"]["peak_concurrency"] == 16
    table = target_table(done.stderr)
    rate = f"{document['half_peak']['rate']:.0f}"
    assert [(target, cells[2]) for target, cells in table.items()] == [
        ("ExecuteTool c=16, cache hits", ">= 0.65"), ("ExecuteTool c=16, distinct arguments", ">= 0.5"),
        (f"added p99 at {rate}/s (half of peak)", "<= 1.0 ms"),
        ("server CPU per call c=16, cache hits / echo", "<= 2.0"),
        ("server CPU per call c=16, distinct arguments / echo", "<= 2.5"),
        ("added p50 at c=1, cache hits", "<= 0.25 ms"), ("added p99 at c=1, cache hits", "<= 0.5 ms"),
        ("added p50 at c=1, distinct arguments", "<= 0.25 ms"), ("added p99 at c=1, distinct arguments", "<= 0.5 ms")]
    assert {cells[3] for cells in table.values()} <= {"yes", "NO"}
    c1 = document["levels"][0]
    added_p50 = c1["sidecar"]["p50_ms"] - c1["echo"]["p50_ms"]  # the difference of the medians
    assert table["added p50 at c=1, cache hits"][1] == f"{added_p50:.2f} ms"
    c16 = document["levels"][1]
    cpu = c16["sidecar"]["server_cpu_ms_per_call"], c16["echo"]["server_cpu_ms_per_call"]
    ratio = table["server CPU per call c=16, cache hits / echo"][1]  # n/a if the echo's few calls took no tick
    assert ratio == ("n/a" if not cpu[1] else f"{cpu[0] / cpu[1]:.2f}")


@pytest.mark.slow
def test_the_observability_benchmark_counts_the_spans_its_otlp_sink_received() -> None:
    command = ["benchmarks/bench_observability.py", "--calls", "40", "--warmup", "5", "--concurrency", "2",
               "--repeat", "2", "--variant", "otlp={}", "--variant-env", "otlp=OTEL_TRACES_EXPORTER=otlp", "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    [otlp] = [config for config in json.loads(done.stdout)["configs"] if config["name"] == "otlp"]
    assert otlp["spans"]["calls"] == 1 + 2 * (5 + 40)  # the first call, then warm-up and calls of each run
    assert otlp["spans"]["received"] == 3 * otlp["spans"]["calls"]  # every read traced: call, policy, handler


@pytest.mark.slow
def test_the_soak_runs_to_its_report() -> None:
    """A few seconds of soak; its timing verdicts (RSS, p99 drift) depend on the machine, the others do not."""
    command = ["benchmarks/soak.py", "--minutes", "0.1", "--bucket-seconds", "3", "--peak-seconds", "1", "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(done.stdout)
    verdicts = report["verdicts"]
    for name in ("no unexpected errors", "every reload seen", "fresh writes ran exactly once", "fresh writes audited",
                 "audit chain verified", "sidecar stopped cleanly"):
        assert verdicts[name], (name, report)
    assert report["reloads"] >= 1 and report["fresh_writes"] > 0 and report["typed_results"]["approval_required"] > 0
    idle, end = report["idle_rss_mb"], report["end_rss_mb"]
    assert 10 < idle <= end and report["rss_to_idle"] == pytest.approx(end / idle), report
    row = {"target": "RSS after 0.1 min at half of peak / idle", "figure": f"{end:.1f} MB (idle {idle:.1f})",
           "ratio": f"{report['rss_to_idle']:.2f}", "wanted": "<= 1.5",
           "met": "yes" if report["rss_to_idle"] <= 1.5 else "NO"}
    assert report["target_rows"] == [row]
    assert target_table(done.stderr) == {row["target"]: [row["figure"], row["ratio"], row["wanted"], row["met"]]}


def test_a_stop_command_needs_a_start_command() -> None:
    done = subprocess.run([sys.executable, "benchmarks/soak.py", "--postgres", "--stop-command", "true"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--stop-command and --start-command go together" in done.stderr


def test_the_soak_refuses_a_negative_idle_time() -> None:
    done = subprocess.run([sys.executable, "benchmarks/soak.py", "--idle-seconds", "-1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--idle-seconds at least 0" in done.stderr


def test_the_image_benchmark_names_what_is_missing_and_how_to_make_it() -> None:
    env = {**os.environ, "TOOLBOOTH_PYTHON_IMAGE": "localhost/toolbooth-no-such-base:1"}
    done = subprocess.run([sys.executable, "benchmarks/bench_image.py"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stderr.endswith(": run bash .ci/image-tools (as root)\n"), done.stderr
    assert ("the base image localhost/toolbooth-no-such-base:1 is missing" in done.stderr
            or "buildah, podman, runc or their containers.conf are missing" in done.stderr)


def test_a_bad_arguments_mode_is_refused() -> None:
    done = subprocess.run([sys.executable, "benchmarks/bench_execute.py", "--arguments", "repeated,random"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--arguments: expected a comma-separated list of repeated, distinct" in done.stderr


@pytest.mark.slow
def test_the_targets_run_puts_each_benchmarks_targets_in_one_table() -> None:
    command = ["benchmarks/targets.py", "--only", "workers,list_tools", "--calls", "20", "--repeat", "1", "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout)
    assert [row["target"] for row in document["rows"]] == [
        "ExecuteTool c=16, server.workers: 2", "ListTools, 200 tools, p50 over gRPC",
        "ListTools CPU, 200 tools / installed", "ExecuteTool CPU, 200 tools / installed"]
    assert {row["met"] for row in document["rows"]} <= {"yes", "NO"} and document["failed"] == []
    assert set(document["benchmarks"]) == {"workers", "list_tools"}


def test_the_targets_run_refuses_an_unknown_benchmark() -> None:
    done = subprocess.run([sys.executable, "benchmarks/targets.py", "--only", "execute,soaks"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--only: unknown benchmark(s) ['soaks']" in done.stderr


def test_the_targets_run_refuses_a_soak_of_no_length() -> None:
    done = subprocess.run([sys.executable, "benchmarks/targets.py", "--only", "soak", "--soak-minutes", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--soak-minutes must be more than 0" in done.stderr


@pytest.mark.slow
def test_the_targets_run_names_a_benchmark_that_failed_and_exits_1() -> None:
    env = {**os.environ, "TOOLBOOTH_TEST_POSTGRES_DSN": "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2"}
    command = ["benchmarks/targets.py", "--only", "writes", "--calls", "20", "--repeat", "1"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "FAILED writes: bench_writes.py exited with" in done.stdout


@pytest.mark.slow
def test_the_instruction_count_benchmark_counts_each_config_and_the_echo() -> None:
    """A few calls under callgrind: each config's count is a whole call's work (the dump's, not start-up's), in each
    argument mode, and the bare grpcio echo's count is less than the sidecar's."""
    command = ["benchmarks/bench_instructions.py", "--calls", "20", "--warmup", "5", "--concurrency", "2",
               "--arguments", "repeated,distinct", "--variant", "metrics=metrics: {listen: '127.0.0.1:$PORT'}",
               "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    configs = {(config["name"], config["arguments"]): config for config in json.loads(done.stdout)["configs"]}
    assert set(configs) == {(name, mode) for name in ("baseline", "metrics", "echo") for mode in ("repeated",
                                                                                                 "distinct")}
    for config in configs.values():  # a call is hundreds of thousands of instructions; start-up is billions
        assert 100_000 < config["instructions_per_call"] < 50_000_000, config
        assert config["failures"] == 0 and len(config["runs"]) == 1
    for mode in ("repeated", "distinct"):
        assert configs["baseline", mode]["ratio"] == 1.0 and configs["echo", mode]["echo_ratio"] == 1.0
        assert configs["baseline", mode]["echo_ratio"] > 1.0  # the sidecar does all that the echo does, and more


@pytest.mark.slow
def test_the_targets_run_puts_the_instruction_ratios_to_the_echo_in_its_table() -> None:
    command = ["benchmarks/targets.py", "--only", "instructions", "--calls", "20", "--repeat", "1", "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout)
    assert [(row["target"], row["wanted"]) for row in document["rows"]] == [
        ("instructions c=16, cache hits / echo", "<= 2.0"), ("instructions c=16, distinct arguments / echo", "<= 2.5")]
    assert {row["met"] for row in document["rows"]} <= {"yes", "NO"} and document["failed"] == []
    assert {config["name"] for config in document["benchmarks"]["instructions"]["configs"]} == {"baseline", "echo"}


def test_the_instruction_count_benchmark_without_valgrind_says_what_to_install(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "benchmarks/bench_instructions.py", "--calls", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PATH": str(tmp_path)})  # no valgrind on it
    assert done.returncode == 2
    assert "valgrind is not installed (Debian: apt-get install valgrind)" in done.stderr


@pytest.mark.slow
def test_the_history_benchmark_counts_a_set_reading_no_history_and_one_reading_a_meter_and_labels() -> None:
    """A few calls under callgrind for each config: the meter counted every call made to its sidecar, none else."""
    command = ["benchmarks/bench_history.py", "--calls", "20", "--warmup", "5", "--concurrency", "2", "--json"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    configs = {config["name"]: config for config in json.loads(done.stdout)["configs"]}
    assert set(configs) == {"none", "meter+labels"}
    for config in configs.values():
        assert 100_000 < config["instructions_per_call"] < 50_000_000, config
    assert configs["none"]["ratio"] == 1.0
    [none], [metered] = configs["none"]["runs"], configs["meter+labels"]["runs"]
    assert none["history"]["calls"] == 0 and metered["history"]["calls"] == 1 + 2 * 5 + 20


def test_the_instruction_count_benchmark_refuses_an_unknown_arguments_mode() -> None:
    done = subprocess.run([sys.executable, "benchmarks/bench_instructions.py", "--arguments", "repeated,cached"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "--arguments: expected a comma-separated list of repeated, distinct, each once" in done.stderr
