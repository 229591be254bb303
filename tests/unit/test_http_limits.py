"""The bounds of the HTTP listeners: ``mcp.http`` and ``approvals_ui.http`` validated with errors naming the key,
the caps checked against the process's file descriptors at start, and repeated log records rate-limited."""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import parse_settings
from sidecar.errors import ConfigError
from sidecar.server import http_guard
from sidecar.server.http_guard import check_descriptors
from sidecar.server.http_limits import listener_limits
from sidecar.telemetry.repeats import RepeatLimit

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_the_largest_head() -> None:
    settings = parse_settings({"mcp": {"listen": "127.0.0.1:0"}, "auth": {"max_token_bytes": 4096}})
    limits = listener_limits(settings, "mcp")
    assert (limits.settings.header_timeout_seconds, limits.settings.request_timeout_seconds,
            limits.settings.idle_timeout_seconds, limits.settings.max_connections) == (10.0, 60.0, 5, 256)
    assert limits.max_head_bytes == 4096 + 8192
    defaults = parse_settings({})
    assert defaults.approvals_ui.http == settings.mcp.http.model_copy(update={"max_connections": 128})
    assert defaults.metrics.http.model_dump() == {"header_timeout_seconds": 10.0, "idle_timeout_seconds": 5,
                                                  "max_connections": 32}


@pytest.mark.parametrize(("section", "values", "expected"), [
    ("mcp", {"header_timeout_seconds": 0}, "config error at mcp.http.header_timeout_seconds: Input should be greater"),
    ("mcp", {"request_timeout_seconds": "soon"}, "config error at mcp.http.request_timeout_seconds: Input should be"),
    ("approvals_ui", {"idle_timeout_seconds": 0.5}, "config error at approvals_ui.http.idle_timeout_seconds"),
    ("approvals_ui", {"max_connections": 0}, "config error at approvals_ui.http.max_connections: Input should be "
                                             "greater than or equal to 1"),
    ("mcp", {"header_timeout_seconds": 20, "request_timeout_seconds": 10},
     "header_timeout_seconds (20) may not exceed request_timeout_seconds (10)"),
    ("mcp", {"read_timeout_seconds": 1}, "config error at mcp.http.read_timeout_seconds: unknown key"),
    ("metrics", {"max_connections": 0}, "config error at metrics.http.max_connections: Input should be greater"),
    ("metrics", {"request_timeout_seconds": 5}, "config error at metrics.http.request_timeout_seconds: unknown key"),
])
def test_bad_values_name_the_key(section: str, values: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_settings({section: {"http": values}})
    assert expected in str(raised.value)


def test_caps_that_could_take_half_the_file_descriptors_refuse_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    soft = 1024
    monkeypatch.setattr(http_guard.resource, "getrlimit", lambda kind: (soft, resource.RLIM_INFINITY))
    cap = min(soft // 4 + 1, 65536)
    settings = parse_settings({"mcp": {"listen": "127.0.0.1:0", "http": {"max_connections": cap}},
                               "approvals_ui": {"listen": "127.0.0.1:0", "http": {"max_connections": cap}}})
    with pytest.raises(OSError) as raised:
        check_descriptors(settings)
    assert str(raised.value) == (
        f"the HTTP listeners may hold {2 * cap} connections (mcp.http.max_connections "
        f"{cap} + approvals_ui.http.max_connections {cap}), more than half of the {soft} files this process may "
        "open (RLIMIT_NOFILE); lower them or raise the limit (ulimit -n, systemd's LimitNOFILE=)")
    alone = parse_settings({"mcp": {"listen": "127.0.0.1:0", "http": {"max_connections": cap}},
                            "approvals_ui": {"http": {"max_connections": cap}}})  # the inbox is off: not counted
    check_descriptors(alone)
    assert listener_limits(alone, "mcp").settings.max_connections == cap
    with_metrics = parse_settings({"mcp": {"listen": "127.0.0.1:0", "http": {"max_connections": cap}},
                                   "metrics": {"listen": "127.0.0.1:0", "http": {"max_connections": cap}}})
    with pytest.raises(OSError, match=r"^the HTTP listeners may hold \d+ connections \(mcp.http.max_connections "
                                      r"\d+ \+ metrics.http.max_connections \d+\)"):
        check_descriptors(with_metrics)


def test_no_cap_is_too_large_without_a_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_guard.resource, "getrlimit", lambda kind: (resource.RLIM_INFINITY,) * 2)
    largest = {"listen": "127.0.0.1:0", "http": {"max_connections": 65536}}
    check_descriptors(parse_settings({"mcp": largest, "approvals_ui": largest, "metrics": largest}))


@pytest.mark.parametrize("command", [["config", "validate"], ["serve"]])
def test_validate_and_serve_refuse_caps_past_half_the_file_limit(command: list[str], tmp_path: Path) -> None:
    config = tmp_path / "toolbooth.json"
    config.write_text(json.dumps({"store": {"sqlite_path": str(tmp_path / "s.db")},
                                  "server": {"listen": [f"unix://{tmp_path / 's.sock'}"]},
                                  "metrics": {"listen": "127.0.0.1:0", "http": {"max_connections": 200}}}))
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
    # The limit is set by a fresh interpreter that then becomes the sidecar, not by ``preexec_fn``: a fork of
    # this process, which runs gRPC's threads, may abort in gRPC's fork handlers before the child execs.
    lowered = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, int(sys.argv[1]))); "
               "os.execv(sys.executable, [sys.executable, '-m', 'sidecar', *sys.argv[2:]])")
    done = subprocess.run([sys.executable, "-c", lowered, str(_hard()), *command, "--config", str(config)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (1, (
        "toolbooth: error: the HTTP listeners may hold 200 connections (metrics.http.max_connections 200), more "
        "than half of the 256 files this process may open (RLIMIT_NOFILE); lower them or raise the limit "
        "(ulimit -n, systemd's LimitNOFILE=)\n"))
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "s.db").exists()  # nothing was opened


def _hard() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def test_the_default_caps_of_all_three_listeners_fit_the_usual_descriptor_limit() -> None:
    settings = parse_settings({})
    caps = [section.http.max_connections for section in (settings.mcp, settings.approvals_ui, settings.metrics)]
    assert 2 * sum(caps) <= 1024


def _record(message: str, *args: object, line: int = 1) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", line, message, args, None)


def test_repeats_pass_a_few_per_window_and_the_next_window_counts_the_rest() -> None:
    now = [0.0]
    limit = RepeatLimit(burst=2, window=60, clock=lambda: now[0])
    accept_error = "socket.accept() out of system resource\nsocket: <%s>"
    assert [limit.filter(_record(accept_error, f"fd={n}")) for n in range(5)] == [True, True, False, False, False]
    assert limit.filter(_record("another kind")) and limit.filter(_record(accept_error, "x", line=2))
    now[0] = 60.0
    record = _record(accept_error, "fd=9")
    assert limit.filter(record)
    assert record.getMessage() == "socket.accept() out of system resource\nsocket: <fd=9> (3 similar messages " \
                                  "suppressed)"
    assert record.suppressed == 3
    again = _record(accept_error, "fd=10")
    assert limit.filter(again) and again.getMessage().endswith("<fd=10>")
