"""The ``toolbooth`` command as real processes: ``serve`` on a real Unix socket, ``tools list``, ``call`` and
``call-batch``.

Needs the calculator plugin installed (``pip install -e plugins/calculator --no-deps``).
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import Client
from sidecar.config import bundled_policy_dir
from tests.support.cli import (
    ADD_2_3,
    ALLOW_BUNDLED,
    Sidecar,
    cli_env,
    short_dir,
    start_sidecar,
    toolbooth,
    write_config,
)
from tests.support.installed import ONLY_BUNDLED

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def sidecar() -> Iterator[Sidecar]:
    """One sidecar for the read-only tests of this module."""
    home = short_dir()
    running = start_sidecar(home, home / "tb.sock", "--config", str(write_config(home)))
    yield running
    running.stop()
    shutil.rmtree(home, ignore_errors=True)


# --- against a running sidecar ------------------------------------------------------------------------------


def test_tools_list_table(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("tools", "list", "--target", sidecar.target, env=env)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split() == ["NAME", "VERSION", "SIDE", "EFFECT", "KEY", "REQUIRED", "TIMEOUT"]
    assert ["calculate", "1.0.0", "none", "no", "0.5s"] in [row.split() for row in rows]


def test_tools_list_json(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("tools", "list", "--target", sidecar.target, "--output", "json", env=env)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    calculate = {tool["name"]: tool for tool in listing["tools"]}["calculate"]
    assert calculate["side_effect"] == "none"
    assert calculate["requires_idempotency_key"] is False
    assert calculate["input_schema"]["properties"]["operation"]["enum"][0] == "add"
    assert listing["policy_revision"].startswith("sha256:")


@pytest.mark.parametrize(("fmt", "name_of"), [
    ("openai", lambda tool: tool["function"]["name"]),
    ("anthropic", lambda tool: tool["name"]),
    ("mcp", lambda tool: tool["name"]),
])
def test_tools_export_prints_the_listing_as_provider_tools(sidecar: Sidecar, env: dict[str, str], fmt: str,
                                                           name_of: Any) -> None:
    done = toolbooth("tools", "export", "--format", fmt, "--target", sidecar.target, env=env)
    assert done.returncode == 0, done.stderr
    exported = {name_of(tool): tool for tool in json.loads(done.stdout)}
    calculate = exported["calculate"]
    if fmt == "openai":
        assert calculate["function"]["strict"] is True  # its schema allows strict mode
        assert "'calculate'" not in done.stderr  # notes name only the other plugins' tools that are not strict
        assert "examples" not in calculate["function"]["parameters"]["properties"]["operands"]
    elif fmt == "anthropic":
        assert calculate["input_schema"]["properties"]["operation"]["enum"][0] == "add"
    else:
        assert calculate["annotations"]["readOnlyHint"] is True
        assert calculate["outputSchema"]["properties"]["data"]["anyOf"][0]["required"] == ["result", "expression"]


def test_tools_export_needs_a_known_format(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("tools", "export", "--format", "gemini", "--target", sidecar.target, env=env)
    assert done.returncode == 2
    assert "argument --format: invalid choice: 'gemini' (choose from 'openai', 'anthropic', 'mcp')" in done.stderr


def test_call_prints_the_typed_result(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("call", "calculate", "--args", ADD_2_3, "--target", sidecar.target, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "success"
    assert result["data"]["result"] == 5.0
    assert result["error"] is None
    assert result["meta"]["tool"] == "calculate"
    assert done.stdout.startswith('{\n  "status": "success",')


def test_call_reads_args_from_a_file_and_from_stdin(sidecar: Sidecar, env: dict[str, str], home: Path) -> None:
    args_file = home / "args.json"
    args_file.write_text('{"operation": "multiply", "operands": [4, 5]}')
    from_file = toolbooth("call", "calculate", "--args", f"@{args_file}", "--target", sidecar.target, env=env)
    from_stdin = toolbooth("call", "calculate", "--args", "-", "--target", sidecar.target, env=env,
                           stdin='{"operation": "subtract", "operands": [9, 4]}')
    assert json.loads(from_file.stdout)["data"]["result"] == 20.0
    assert json.loads(from_stdin.stdout)["data"]["result"] == 5.0


def test_target_from_env(sidecar: Sidecar, home: Path) -> None:
    done = toolbooth("call", "calculate", "--args", ADD_2_3, env=cli_env(home, TOOLBOOTH_TARGET=sidecar.target))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"]["result"] == 5.0


def test_invalid_args_are_sent_and_rejected_by_the_server(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("call", "calculate", "--args", '{"operation": "sqrt"}', "--target", sidecar.target, env=env)
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "error"
    assert result["error"]["code"] == "INVALID_ARGUMENT"
    assert result["error"]["recovery"] == "correct_arguments"


def test_args_that_are_not_json_exit_2_and_the_server_still_rejects_them(sidecar: Sidecar,
                                                                          env: dict[str, str]) -> None:
    broken = '{"operation": "add", "operands": [2, 3]'
    done = toolbooth("call", "calculate", "--args", broken, "--target", sidecar.target, env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == ("toolbooth: error: --args is not valid JSON: Expecting ',' delimiter at line 1 column 40 "
                           "(character 39)\n")
    with Client(sidecar.target) as client:  # the sidecar stays the validator of whatever reaches it
        result = client.execute("calculate", broken)
    assert result.status.value == "error"
    assert result.error is not None
    assert (result.error.code.value, result.error.recovery.value) == ("INVALID_ARGUMENT", "correct_arguments")


def test_unknown_tool_exits_3(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("call", "no_such_tool", "--target", sidecar.target, env=env)
    assert done.returncode == 3
    assert json.loads(done.stdout)["error"]["code"] == "TOOL_UNAVAILABLE"


def test_call_batch_prints_the_results_in_order_and_exits_as_call_for_the_worst(sidecar: Sidecar,
                                                                              env: dict[str, str],
                                                                              home: Path) -> None:
    calls = home / "calls.json"
    calls.write_text(json.dumps([{"tool": "calculate", "arguments": {"operation": "multiply", "operands": [4, 5]}},
                                 {"tool": "calculate", "arguments": {"operation": "sqrt"}, "call_id": "c-2"},
                                 {"tool": "calculate", "arguments": json.loads(ADD_2_3)}]))
    done = toolbooth("call-batch", str(calls), "--max-concurrency", "2", "--target", sidecar.target, env=env)
    assert done.returncode == 3, done.stderr
    results = json.loads(done.stdout)
    assert [r["status"] for r in results] == ["success", "error", "success"]
    assert (results[0]["data"]["result"], results[2]["data"]["result"]) == (20.0, 5.0)
    assert results[1]["error"]["code"] == "INVALID_ARGUMENT"
    jsonl = f'{{"tool": "calculate", "arguments": {ADD_2_3}}}\n' * 2
    from_stdin = toolbooth("call-batch", "-", "--cancel-on-permanent-failure", "--target", sidecar.target, env=env,
                           stdin=jsonl)
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert [r["data"]["result"] for r in json.loads(from_stdin.stdout)] == [5.0, 5.0]


def test_call_batch_of_no_calls_is_a_usage_error_and_sends_nothing(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("call-batch", "-", "--target", sidecar.target, env=env, stdin="[]")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "toolbooth: error: stdin: no calls\n")


# --- without a sidecar --------------------------------------------------------------------------------------


def test_no_sidecar_on_the_default_socket(env: dict[str, str]) -> None:
    done = toolbooth("call", "calculate", "--args", ADD_2_3, env=env)
    assert done.returncode == 1
    assert done.stdout == ""
    first, hint = done.stderr.splitlines()
    assert first.startswith("toolbooth: error: UNAVAILABLE: ")
    assert hint.endswith("is the sidecar running? start it with `toolbooth serve`")


def test_no_sidecar_on_an_explicit_socket(env: dict[str, str], home: Path) -> None:
    target = f"unix://{home}/absent.sock"
    done = toolbooth("tools", "list", "--target", target, env=env)
    assert done.returncode == 1
    assert f"start it with `toolbooth serve --listen {target}`" in done.stderr
    assert "Traceback" not in done.stderr


# --- the serve process --------------------------------------------------------------------------------------


def test_serve_and_call_meet_with_no_flags_and_sigterm_stops_cleanly(home: Path, env: dict[str, str]) -> None:
    socket = home / "run" / "toolbooth" / "toolbooth.sock"
    running = start_sidecar(home, socket, env=cli_env(home, **ONLY_BUNDLED))  # no flags, and the bundled plugins
    try:
        done = toolbooth("call", "calculate", "--args", ADD_2_3, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["data"]["result"] == 5.0
    finally:
        code = running.stop(signal.SIGTERM)
    assert code == 0, running.log.read_text()
    assert not socket.exists()
    assert "Traceback" not in running.log.read_text()


def test_approval_required_exits_4(home: Path, env: dict[str, str]) -> None:
    policy = home / "policy"
    shutil.copytree(bundled_policy_dir(), policy)
    data = json.loads((policy / "data.json").read_text())
    data["toolbooth"]["approval"]["tools"] = ["calculate"]
    (policy / "data.json").write_text(json.dumps(data))
    running = start_sidecar(home, home / "tb.sock", "--config", str(write_config(home, policy=policy)))
    try:
        done = toolbooth("call", "calculate", "--args", ADD_2_3, "--target", running.target, env=env)
    finally:
        running.stop()
    assert done.returncode == 4, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "approval_required"
    assert result["data"] is None
    assert (result["error"]["code"], result["error"]["recovery"]) == ("APPROVAL_REQUIRED", "request_user_input")


def test_serve_with_a_bad_config_exits_2(home: Path, env: dict[str, str]) -> None:
    config = home / "bad.yaml"
    config.write_text(f"server:\n  listen: ['unix://{home}/tb.sock']\nstore:\n  sqlite_pth: {home}/tb.db\n")
    done = toolbooth("serve", "--config", str(config), env=env)
    assert done.returncode == 2
    assert done.stderr == ("toolbooth: error: config error at store.sqlite_pth: unknown key "
                           "(did you mean 'sqlite_path'?)\n")
    assert not (home / "tb.sock").exists()


def test_serve_refuses_a_meter_looking_back_further_than_the_history_is_kept(home: Path, env: dict[str, str]) -> None:
    policy = home / "policy"
    shutil.copytree(bundled_policy_dir(), policy)
    data = json.loads((policy / "data.json").read_text())
    data["toolbooth"]["history"]["meters"]["writes_per_principal"]["window_seconds"] = 90000
    (policy / "data.json").write_text(json.dumps(data))
    config = write_config(home, policy=policy)
    config.write_text(config.read_text().replace("\npolicy:", "\n  history_retention_hours: 24\npolicy:"))
    done = toolbooth("serve", "--config", str(config), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.endswith(
        "toolbooth: error: meter 'writes_per_principal' of the policy looks back 90000 s, longer than the call "
        "history is kept (86400 s: store.history_retention_hours); shorten its window_seconds or raise "
        "store.history_retention_hours\n")
    assert "Traceback" not in done.stderr and not (home / "tb.sock").exists()


@pytest.mark.parametrize(("plugins", "variables", "error"), [
    (ALLOW_BUNDLED + "  config:\n    email:\n      smtp: {port: 70000}\n", {},
     "config error at plugins.config.email.smtp.port: Input should be less than or equal to 65535"),
    ("  allow: [tasks]\n", {"TOOLBOOTH_PLUGINS__CONFIG__TASKS__PREVIEW_TTL_SECONDS": "0"},
     "config error at plugins.config.tasks.preview_ttl_seconds (from TOOLBOOTH_PLUGINS__CONFIG__TASKS__PREVIEW_TTL_"
     "SECONDS): Input should be greater than or equal to 1"),
    (ALLOW_BUNDLED + "  config:\n    emails: {}\n", {},
     "config error at plugins.config.emails: no plugin 'emails' is loaded"),
])
def test_serve_refuses_to_start_with_bad_plugin_settings(home: Path, env: dict[str, str], plugins: str,
                                                         variables: dict[str, str], error: str) -> None:
    config = write_config(home, plugins=plugins)
    done = toolbooth("serve", "--config", str(config), env={**env, **variables})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"toolbooth: error: {error}") and "Traceback" not in done.stderr
    assert not (home / "tb.sock").exists()


def test_serve_refuses_a_public_address_in_dev_mode(home: Path, env: dict[str, str]) -> None:
    done = toolbooth("serve", "--config", str(write_config(home)), "--listen", "0.0.0.0:0", env=env)
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert last.startswith("toolbooth: error: ")
    assert "'0.0.0.0:0' is not a loopback address" in last
    assert "Traceback" not in done.stderr


def test_serve_on_a_live_socket_exits_1(sidecar: Sidecar, env: dict[str, str]) -> None:
    done = toolbooth("serve", "--listen", sidecar.target, env=env)
    assert done.returncode == 1
    assert f"cannot listen on {sidecar.socket}: another process is listening there" in done.stderr
    assert "Traceback" not in done.stderr
    assert sidecar.socket.exists()
