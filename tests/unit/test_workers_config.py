"""``server.workers``: its validation, what each worker serves (``WorkerPlan``), and the crash-loop bound."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from sidecar.config import MAX_WORKERS, load_settings, parse_settings
from sidecar.errors import ConfigError
from sidecar.server import supervisor
from sidecar.server.supervisor import WorkerFailed, _CrashCount
from sidecar.server.worker_plan import WorkerPlan


def tcp(**server: Any) -> dict[str, Any]:
    return {"server": {"listen": ["127.0.0.1:0"], **server}}


def test_one_worker_is_the_default() -> None:
    assert parse_settings({}).server.workers == 1


@pytest.mark.parametrize("value", [0, -1, MAX_WORKERS + 1])
def test_workers_out_of_range_is_refused(value: int) -> None:
    with pytest.raises(ConfigError, match=r"config error at server\.workers: Input should be"):
        parse_settings(tcp(workers=value))


@pytest.mark.parametrize("value", [True, 1.5, 2.0, "2", None])
def test_workers_must_be_a_whole_number(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"config error at server\.workers: .* is not a whole number of worker "
                                          rf"processes \(1-{MAX_WORKERS}\)"):
        parse_settings(tcp(workers=value))


def test_workers_from_the_environment_is_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"TOOLBOOTH_SERVER__WORKERS": "4", "TOOLBOOTH_SERVER__LISTEN": "127.0.0.1:0"}
    assert load_settings(None, env=env).server.workers == 4
    with pytest.raises(ConfigError, match=r"server\.workers \(from TOOLBOOTH_SERVER__WORKERS\)"):
        load_settings(None, env={**env, "TOOLBOOTH_SERVER__WORKERS": "four"})


@pytest.mark.parametrize("address", ["unix:/tmp/tb.sock", "unix-abstract:toolbooth"])
def test_several_workers_need_tcp_addresses(address: str) -> None:
    with pytest.raises(ConfigError, match=rf"workers: 2 needs TCP addresses only in 'listen', and '{address}' is a "
                                          "Unix socket"):
        parse_settings({"server": {"listen": ["127.0.0.1:0", address], "workers": 2}})
    assert parse_settings({"server": {"listen": [address]}}).server.workers == 1  # one worker: as before


def test_each_worker_needs_a_metrics_port() -> None:
    with pytest.raises(ConfigError, match=r"metrics\.listen: '127\.0\.0\.1:65535': with server\.workers: 2 worker i "
                                          r"serves metrics on port 65535 \+ i"):
        parse_settings({**tcp(workers=2), "metrics": {"listen": "127.0.0.1:65535"}})
    assert parse_settings({**tcp(workers=1), "metrics": {"listen": "127.0.0.1:65535"}})
    assert parse_settings({**tcp(workers=2), "metrics": {"listen": "127.0.0.1:0"}})


def test_every_worker_binds_the_reserved_ports_and_only_worker_0_serves_mcp_and_the_inbox() -> None:
    settings = parse_settings({**tcp(workers=3, health_listen="127.0.0.1:0"), "auth": {"mode": "dev"},
                               "metrics": {"listen": "127.0.0.1:19100"}, "mcp": {"listen": "127.0.0.1:0"},
                               "approvals_ui": {"listen": "127.0.0.1:0"}})
    plan = WorkerPlan.reserve(settings)
    try:
        port = int(plan.listen[0].rpartition(":")[2])
        assert port != 0 and plan.health_listen is not None and not plan.health_listen.endswith(":0")
        # The port is held: a process that does not share it cannot bind it.
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        workers = [plan.settings_for(index) for index in range(3)]
        assert {w.server.listen for w in workers} == {plan.listen}
        assert {w.server.health_listen for w in workers} == {plan.health_listen}
        assert [w.metrics.listen for w in workers] == ["127.0.0.1:19100", "127.0.0.1:19101", "127.0.0.1:19102"]
        assert [w.mcp.listen is not None for w in workers] == [True, False, False]
        assert [w.approvals_ui.listen is not None for w in workers] == [True, False, False]
    finally:
        plan.close()


def test_a_port_another_process_listens_on_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = parse_settings(tcp(workers=2) | {"server": {"listen": [f"127.0.0.1:{port}"], "workers": 2}})
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}: the port is in use"):
            WorkerPlan.reserve(settings)


def test_restarts_wait_longer_each_time_and_a_crash_loop_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: now[0])
    crashes = _CrashCount()
    waits = []
    for _ in range(supervisor._CRASHES_ALLOWED):
        waits.append(crashes.record())
        now[0] += 1
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0]
    with pytest.raises(WorkerFailed, match="workers died 6 times within 60 s") as raised:
        crashes.record()
    assert raised.value.exit_code == 1


def test_deaths_far_apart_are_no_crash_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: now[0])
    crashes = _CrashCount()
    for _ in range(3 * supervisor._CRASHES_ALLOWED):
        assert crashes.record() == 0.5  # each the only one within the window
        now[0] += supervisor._CRASH_WINDOW_SECONDS + 1
