"""``server.workers: auto``: counted once as the settings load, shown by ``config validate``, and one worker counted
runs ``serve``'s single-process path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import serve as serve_command
from sidecar.cli.root import main
from sidecar.config import MAX_WORKERS, cpus, load_settings, parse_settings
from sidecar.errors import ConfigError
from sidecar.server import supervisor
from sidecar.server.worker_plan import WorkerPlan
from tests.support.cgroups import V2_MOUNT, fake_root

TCP = ["127.0.0.1:0"]


@pytest.fixture
def cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None) -> list[str]:
    """The sidecar counts CPUs in a fake cgroup v2 tree (``cgroup[0]``: its ``cpu.max``) and may run on 128 CPUs;
    how many times it counted is ``len(cgroup) - 1``."""
    root, read = tmp_path / "host", cpus.usable_cpus
    state = ["200000 100000\n"]

    def counted() -> cpus.CpuCount:
        fake_root(root, v2="/", files={f"{V2_MOUNT}/cpu.max": state[0]})
        state.append("counted")
        return read(root)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(128)), raising=False)
    monkeypatch.setattr(cpus, "usable_cpus", counted)
    return state


def config(tmp_path: Path, workers: str, *extra: str) -> Path:
    path = tmp_path / "toolbooth.yaml"
    path.write_text("\n".join(["server:", "  listen: ['127.0.0.1:0']", f"  workers: {workers}", *extra,
                               "auth:\n  mode: dev", "plugins:\n  allow: []",
                               f"store:\n  sqlite_path: {tmp_path}/tb.db", ""]))
    return path


def test_auto_is_the_cgroup_limit_counted_once_as_the_settings_load(tmp_path: Path, cgroup: list[str]) -> None:
    settings = load_settings(config(tmp_path, "auto"))
    assert settings.server.workers == 2
    assert settings.server.workers_auto == cpus.CpuCount(2, f"cgroup cpu.max 200000/100000 in {V2_MOUNT}")
    assert len(cgroup) == 2  # counted once
    assert parse_settings({"server": {"listen": TCP, "workers": 3}}).server.workers_auto is None
    assert len(cgroup) == 2  # a number is not counted


def test_auto_from_the_environment(cgroup: list[str]) -> None:
    cgroup[0] = "150000 100000\n"
    settings = load_settings(None, env={"TOOLBOOTH_SERVER__WORKERS": "auto", "TOOLBOOTH_SERVER__LISTEN": "127.0.0.1:0"})
    assert settings.server.workers == 2
    assert settings.server.workers_auto is not None
    assert settings.server.workers_auto.source.endswith(", 1.5 CPUs rounded up")


def test_auto_runs_at_most_the_largest_number_of_workers(tmp_path: Path, cgroup: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cgroup[0] = "9600000 100000\n"
    settings = parse_settings({"server": {"listen": TCP, "workers": "auto"}})
    assert (settings.server.workers, settings.server.workers_auto.cpus if settings.server.workers_auto else 0) == (
        MAX_WORKERS, 96)
    assert main(["config", "validate", "--config", str(config(tmp_path, "auto"))]) == 0
    assert (f"  workers:  auto (64: cgroup cpu.max 9600000/100000 in {V2_MOUNT}, at most 64)\n"
            in capsys.readouterr().out)


@pytest.mark.parametrize("value", ["autp", "Auto", "all", 1.5, None])
def test_a_word_other_than_auto_names_the_key_and_the_accepted_values(value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^config error at server\.workers: .* is not a whole number of worker "
                                          rf"processes \(1-{MAX_WORKERS}\) or auto \(one per CPU the sidecar may "
                                          r"use\)$"):
        parse_settings({"server": {"listen": TCP, "workers": value}})


@pytest.mark.parametrize("value", [0, -2, MAX_WORKERS + 1])
def test_a_number_out_of_range_names_the_key_and_the_accepted_values(value: int) -> None:
    with pytest.raises(ConfigError, match=rf"^config error at server\.workers: Input should be a whole number of "
                                          rf"worker processes from 1 to {MAX_WORKERS}, or auto"):
        parse_settings({"server": {"listen": TCP, "workers": value}})


def test_a_wrong_value_from_the_environment_names_the_variable(clean_env: None) -> None:
    with pytest.raises(ConfigError, match=r"server\.workers \(from TOOLBOOTH_SERVER__WORKERS\): 'autp' is not"):
        load_settings(None, env={"TOOLBOOTH_SERVER__WORKERS": "autp", "TOOLBOOTH_SERVER__LISTEN": "127.0.0.1:0"})


@pytest.mark.parametrize("limit", ["100000 100000\n", "400000 100000\n"])
def test_auto_needs_tcp_whatever_it_counts(cgroup: list[str], limit: str) -> None:
    """A Unix socket cannot be shared by several workers: refused with one CPU too, so that the configuration that
    loads on one machine loads on every one."""
    cgroup[0] = limit
    with pytest.raises(ConfigError, match=r"config error at server: workers: auto needs TCP addresses only in "
                                          r"'listen', and 'unix:/tmp/tb\.sock' is a Unix socket"):
        parse_settings({"server": {"listen": ["127.0.0.1:0", "unix:/tmp/tb.sock"], "workers": "auto"}})


def test_other_errors_of_the_section_are_reported_as_for_a_number(cgroup: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"config error at server\.shutdown_grace_seconds: Input should be"):
        parse_settings({"server": {"listen": TCP, "workers": "auto", "shutdown_grace_seconds": -1}})


def test_config_validate_says_auto_and_where_the_number_came_from(tmp_path: Path, cgroup: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path, "auto")
    assert main(["config", "validate", "--config", str(path)]) == 0
    assert f"  workers:  auto (2: cgroup cpu.max 200000/100000 in {V2_MOUNT})\n" in capsys.readouterr().out
    assert main(["config", "validate", "--config", str(path), "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["workers"], document["workers_auto"]) == (
        2, {"cpus": 2, "source": f"cgroup cpu.max 200000/100000 in {V2_MOUNT}"})
    assert main(["config", "validate", "--config", str(config(tmp_path, "2"))]) == 0
    assert "  workers:  2\n" in capsys.readouterr().out


def test_each_worker_gets_the_number_counted_not_auto(cgroup: list[str]) -> None:
    settings = parse_settings({"server": {"listen": TCP, "workers": "auto"}})
    plan = WorkerPlan.reserve(settings)
    try:
        assert {plan.settings_for(index).server.workers for index in range(2)} == {2}
    finally:
        plan.close()
    assert len(cgroup) == 2  # the workers' settings are not counted again


def test_one_cpu_counted_serves_in_one_process_as_workers_1(tmp_path: Path, cgroup: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cgroup[0] = "80000 100000\n"
    served = []

    async def serve(settings: Any) -> None:
        served.append(settings)

    async def supervise(settings: Any) -> int:
        raise AssertionError("one worker counted must not start a supervisor")

    monkeypatch.setattr("sidecar.bootstrap.serve", serve)
    monkeypatch.setattr(supervisor, "supervise", supervise)
    monkeypatch.setattr(serve_command, "setup_logging", lambda level, format: None)
    assert main(["serve", "--config", str(config(tmp_path, "auto"))]) == 0
    assert [settings.server.workers for settings in served] == [1]
