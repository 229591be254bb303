"""What ``toolbooth`` prints for people and for scripts, as real processes against a real sidecar and its log:
tables fitted to narrow terminals, ``--output json`` documents and errors, and the progress of long commands
on a terminal's stderr (a pty) that leaves stdout byte for byte as it is without one."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.config import bundled_policy_dir
from sidecar.state import AuditEvent
from sidecar.state.sqlite import SqliteStore
from tests.support.cli import ADD_2_3, cli_env, run_tty_stderr, short_dir, start_sidecar, toolbooth, write_config
from tests.support.tables import assert_aligned, table_rows

pytestmark = pytest.mark.integration

BULK_EVENTS = 2500  # beyond two pages (sidecar.cli.audit.PAGE) of the log
CALLS = 12
DOCUMENTS = "import sys; from toolbooth_documents.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class Logged:
    """A sidecar's home after it served ``CALLS`` calls (then stopped), its log grown by ``BULK_EVENTS``."""

    home: Path
    config: Path
    env: dict[str, str]
    listing: str  # what `tools list --output json` printed while it ran

    def terminal_env(self, **extra: str) -> dict[str, str]:
        return {**self.env, "TERM": "xterm-256color", **extra}


def bulk_event(n: int) -> AuditEvent:
    return AuditEvent(
        request_id=f"bulk-{n}", time=f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}.000+00:00",
        principal_id="dev", tenant="", tool="calculate", tool_version="1.0.0", input_hash=f"sha256:{n:064x}",
        decisions_json="{}", policy_revision="sha256:rev", idempotency_key=None, call_id=None, conversation_id=None,
        status="success", error_code=None, duration_ms=1, arguments_json=ADD_2_3)


@pytest.fixture(scope="module")
def logged() -> Iterator[Logged]:
    home = short_dir()
    config, env = write_config(home), cli_env(home)
    sidecar = start_sidecar(home, home / "tb.sock", "--config", str(config))
    try:
        calls = "".join(json.dumps({"tool": "calculate", "arguments": json.loads(ADD_2_3)}) + "\n"
                        for _ in range(CALLS))
        done = toolbooth("call-batch", "-", "--target", sidecar.target, env=env, stdin=calls)
        assert done.returncode == 0, done.stderr
        listing = toolbooth("tools", "list", "--target", sidecar.target, "--output", "json", env=env)
        assert listing.returncode == 0, listing.stderr
    finally:
        assert sidecar.stop() == 0

    async def grow() -> None:
        store = await SqliteStore.open(home / "tb.db")
        for n in range(BULK_EVENTS):
            store.queue_audit(bulk_event(n))
        await store.aclose()

    asyncio.run(grow())
    yield Logged(home, config, env, listing.stdout)
    shutil.rmtree(home, ignore_errors=True)


# --- progress -----------------------------------------------------------------------------------------------

LONG_COMMANDS = [
    (["audit", "verify"], "verifying the audit chain"),
    (["audit", "export"], "exporting the audit log"),
    (["audit", "export", "--format", "opa"], "exporting the audit log"),
    (["policy", "replay", "--policies", str(bundled_policy_dir())], "replaying the audit log"),
    (["policy", "test"], "running the policy tests"),
]


@pytest.mark.parametrize(("command", "label"), LONG_COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_long_commands_show_progress_on_a_terminal_and_print_the_same(logged: Logged, command: list[str],
                                                                      label: str) -> None:
    argv = [*command, "--config", str(logged.config)]
    piped = toolbooth(*argv, env=logged.env)
    shown = run_tty_stderr([sys.executable, "-m", "sidecar", *argv], env=logged.terminal_env())
    assert shown.returncode == piped.returncode
    assert shown.stdout == piped.stdout  # byte for byte
    assert label in shown.terminal and label not in piped.stderr
    if command == ["audit", "verify"]:
        intact = piped.stdout.splitlines()[0]
        assert intact.startswith("audit chain intact: ") and int(intact.split()[3]) >= BULK_EVENTS + CALLS
        counts = [(int(done), int(total)) for done, total in re.findall(r"(\d+)/(\d+)", shown.terminal)]
        assert counts and counts[-1][0] == counts[-1][1] >= BULK_EVENTS + CALLS  # counted against the total
    if command == ["audit", "export"]:
        assert len(piped.stdout.splitlines()) >= BULK_EVENTS + CALLS


@pytest.mark.parametrize("quiet", [["--no-progress"], ["env", "TOOLBOOTH_NO_PROGRESS=1"], ["env", "TERM=dumb"]],
                         ids=["flag", "variable", "dumb-terminal"])
def test_no_progress_when_asked_or_on_a_dumb_terminal(logged: Logged, quiet: list[str]) -> None:
    flags, env = (quiet, logged.terminal_env()) if quiet[0] != "env" else (
        [], logged.terminal_env(**dict([quiet[1].split("=")])))
    shown = run_tty_stderr([sys.executable, "-m", "sidecar", "audit", "verify", "--config", str(logged.config),
                            *flags], env=env)
    assert shown.returncode == 0 and shown.stdout.startswith("audit chain intact: ")
    assert "verifying" not in shown.terminal and "\x1b[?25l" not in shown.terminal  # nothing drawn, no cursor hidden


def test_progress_never_mixes_into_json(logged: Logged) -> None:
    argv = ["audit", "verify", "--config", str(logged.config), "--output", "json"]
    shown = run_tty_stderr([sys.executable, "-m", "sidecar", *argv], env=logged.terminal_env())
    assert shown.returncode == 0 and "verifying the audit chain" in shown.terminal
    document = json.loads(shown.stdout)
    assert shown.stdout == toolbooth(*argv, env=logged.env).stdout
    assert document["ok"] is True and document["keyed"] is False and document["chain"]["broken"] is None
    assert document["chain"]["checked"] >= BULK_EVENTS + CALLS and document["checkpoint"]["state"] == "unkeyed"
    assert document["warnings"][0].startswith("audit chain unkeyed")


def test_document_indexing_shows_progress(logged: Logged) -> None:
    argv = [sys.executable, "-c", DOCUMENTS, "index", "--sample", "--db", str(logged.home / "docs.db")]
    first = toolbooth_documents(argv, logged.env)
    assert first.returncode == 0 and first.stdout.splitlines()[-1].endswith(": 7 added, 0 updated, 0 unchanged")
    shown = run_tty_stderr(argv, env=logged.terminal_env())
    again = toolbooth_documents(argv, logged.env)
    assert shown.returncode == again.returncode == 0
    assert shown.stdout == again.stdout and again.stdout.splitlines()[-1].endswith(": 0 added, 0 updated, 7 unchanged")
    assert "reading " in shown.terminal and "reading" not in again.stderr


def toolbooth_documents(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


# --- tables -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sidecar_of_log(logged: Logged) -> Iterator[str]:
    running = start_sidecar(logged.home, logged.home / "tb.sock", "--config", str(logged.config))
    yield running.target
    running.stop()


@pytest.mark.parametrize("width", [60, 40])
def test_tools_list_fits_a_narrow_terminal(logged: Logged, sidecar_of_log: str, width: int) -> None:
    done = toolbooth("tools", "list", "--target", sidecar_of_log, env={**logged.env, "COLUMNS": str(width)})
    assert done.returncode == 0, done.stderr
    assert_aligned(done.stdout, 5, width)
    rows = table_rows(done.stdout, ["NAME", "VERSION", "SIDE EFFECT", "KEY REQUIRED", "TIMEOUT"], anchor=1)
    expected = [[t["name"], t["version"], t["side_effect"], "yes" if t["requires_idempotency_key"] else "no",
                 f"{t['timeout_ms'] / 1000:g}s"] for t in json.loads(logged.listing)["tools"]]
    assert rows == expected and len(rows) >= 7


def test_tools_list_is_unchanged_when_piped_without_columns(logged: Logged, sidecar_of_log: str) -> None:
    done = toolbooth("tools", "list", "--target", sidecar_of_log, env=logged.env)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("NAME  ") and len(lines) == 1 + len(json.loads(logged.listing)["tools"])
    assert max(len(line) for line in lines) > 60  # not fitted to any width


# --- --output json ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_result_commands_print_json_with_output_json(logged: Logged, sidecar_of_log: str) -> None:
    target = ["--target", sidecar_of_log]
    listing = json.loads(toolbooth("tools", "list", *target, "--output", "json", env=logged.env).stdout)
    assert set(listing) >= {"tools", "policy_revision"}
    exported = json.loads(toolbooth("tools", "export", "--format", "mcp", *target, "--output", "json",
                                    env=logged.env).stdout)
    assert "calculate" in [tool["name"] for tool in exported]
    field = toolbooth("call", "calculate", "--args", ADD_2_3, "--field", "status", *target, env=logged.env)
    quoted = toolbooth("call", "calculate", "--args", ADD_2_3, "--field", "status", "--output", "json", *target,
                       env=logged.env)
    assert (field.stdout, quoted.stdout) == ("success\n", '"success"\n')
    status = json.loads(toolbooth("policy", "status", *target, "--output", "json", env=logged.env).stdout)
    assert status["revision"].startswith("sha256:") and status["last_error"] is None
    previews = toolbooth("previews", "list", *target, "--output", "json", env=logged.env)
    assert (previews.returncode, json.loads(previews.stdout)) == (0, [])


def test_a_failed_request_is_a_json_error_with_its_exit_code(logged: Logged) -> None:
    target = f"unix://{logged.home}/absent.sock"
    text = toolbooth("tools", "list", "--target", target, env=logged.env)
    done = toolbooth("tools", "list", "--target", target, "--output", "json", env=logged.env)
    assert (text.returncode, done.returncode, done.stdout) == (1, 1, "")
    error = json.loads(done.stderr)["error"]
    assert (error["code"], error["exit_code"]) == ("UNAVAILABLE", 1)
    assert error["message"] == "\n".join(line.removeprefix("toolbooth: error: ")
                                         for line in text.stderr.splitlines())


def test_an_unreadable_store_is_a_json_error(logged: Logged) -> None:
    config = logged.home / "broken.yaml"
    (logged.home / "not-a-db").write_text("this is not SQLite")
    config.write_text(f"store:\n  sqlite_path: {logged.home / 'not-a-db'}\n")
    done = toolbooth("audit", "export", "--config", str(config), "--output", "json", env=logged.env)
    assert (done.returncode, done.stdout) == (1, "")
    assert json.loads(done.stderr)["error"]["code"] == "STORE_UNAVAILABLE"
