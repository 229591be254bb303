"""The everyday commands, used as a careless or hostile user would: real ``toolbooth`` processes, real sidecars
on real sockets.

- ``--config`` naming a missing file, a directory, a list, a misspelt key, a listener on port 0: a usage error
  (exit 2), also as JSON, never a traceback; a config's ``~/`` paths are in the home directory, never a
  directory named ``~``; a relative socket path that finds nothing says which directory it was read against.
- Ctrl-C with ``--output json``: stdout stays empty and stderr is the one JSON error, code ``INTERRUPTED``.
- ``approve`` and ``deny`` with prefixes an approver may not use (another tenant's preview, glob and regular
  expression characters, other scripts, control characters, very long input): refused with the answer an
  unknown id gets, as JSON with ``--output json``; the approval ``approve`` asks for to learn why a preview
  cannot be approved approves nothing, and the audit log records one refused attempt for each command run.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from sidecar.client import Client
from sidecar.contract import Preview, PreviewState
from tests.support.approvals import approvals_sidecar
from tests.support.cli import REPO, START_TIMEOUT, Sidecar, cli_env, toolbooth

pytestmark = pytest.mark.integration

Tokens = Callable[..., str]


def _json_error(run: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The one JSON error a command run with ``--output json`` printed on stderr."""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    error = json.loads(lines[0])["error"]
    assert isinstance(error, dict) and error["exit_code"] == run.returncode
    return error


# --- --config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "code", "said"), [
    ("missing.yaml", "CONFIG", "No such file or directory"),
    (".", "CONFIG", "Is a directory"),
    ("list.yaml", "CONFIG", "must contain a mapping at the top level"),
    ("typo.yaml", "CONFIG", "server.lisen: unknown key (did you mean 'listen'?)"),
    ("port0.yaml", "USAGE", "listens on any free port, which a client cannot know: give --target HOST:PORT"),
])
@pytest.mark.parametrize("command", [["tools", "list"], ["approve", "0123456789abcdef"],
                                     ["policy", "status"]])
def test_a_config_a_client_cannot_use_is_a_usage_error(home: Path, command: list[str], config: str, code: str,
                                                       said: str) -> None:
    (home / "list.yaml").write_text("- a\n- b\n")
    (home / "typo.yaml").write_text("server:\n  lisen: ['127.0.0.1:1']\n")
    (home / "port0.yaml").write_text("server:\n  listen: ['127.0.0.1:0']\n")
    run = toolbooth(*command, "--config", str(home / config), "--output", "json", env=cli_env(home))
    assert (run.returncode, run.stdout) == (2, ""), run.stderr
    error = _json_error(run)
    assert error["code"] == code and said in str(error["message"]), error


def test_a_home_relative_path_in_a_config_is_in_the_home_directory(home: Path) -> None:
    (home / "etc").mkdir()
    config = home / "etc" / "toolbooth.yaml"
    config.write_text(f"server:\n  listen: ['unix://{home}/tb.sock']\nstore:\n  sqlite_path: ~/state/tb.db\n")
    run = toolbooth("config", "validate", "--config", str(config), "--output", "json",
                    env=cli_env(home, HOME=str(home / "me")))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["store"] == f"sqlite {home}/me/state/tb.db"
    assert not (home / "etc" / "~").exists()


def test_a_relative_socket_that_finds_nothing_says_where_it_was_looked_for(home: Path) -> None:
    (home / "etc").mkdir()
    config = home / "etc" / "toolbooth.yaml"
    config.write_text("server:\n  listen: ['unix:tb.sock']\n")
    run = subprocess.run([sys.executable, "-m", "sidecar", "tools", "list", "--config", str(config)], cwd=home,
                         env=cli_env(home), capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1, run.stderr
    assert (f"no socket at tb.sock (a relative socket path is read against the working directory, here {home}, "
            "as the sidecar reads it against its own)") in run.stderr


# --- Ctrl-C with --output json ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["call", "calculate", "--args", "{}"], ["previews", "list"],
                                     ["approve", "0123456789abcdef"]])
def test_ctrl_c_with_json_output_prints_the_json_error(home: Path, command: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        silent.settimeout(START_TIMEOUT)
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        process = subprocess.Popen([sys.executable, "-m", "sidecar", *command, "--target", target, "--output",
                                    "json"], cwd=REPO, env=cli_env(home), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            connection, _ = silent.accept()
        except TimeoutError:
            process.kill()
            pytest.fail(f"the command never connected:\n{process.communicate()[1]}")
        with contextlib.closing(connection):
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
    assert (process.returncode, out) == (130, ""), err
    assert [json.loads(line) for line in err.splitlines()] == [
        {"error": {"code": "INTERRUPTED", "message": "interrupted", "exit_code": 130}}]


# --- approve and deny, hostile ids --------------------------------------------------------------------------


@dataclass
class Desk:
    """A JWT sidecar whose policies hold every ``calculate`` call for approval, and tokens of its callers."""

    sidecar: Sidecar
    home: Path
    tokens: Tokens

    def hold(self, tenant: str = "acme", sub: str = "alice") -> Preview:
        token = self.tokens(sub=sub, tenant=tenant, roles=["developer"])
        with Client(self.sidecar.target, token=token, timeout=30) as client:
            result = client.execute("calculate", {"operation": "add", "operands": [1, 2]})
        assert result.preview is not None, result
        return result.preview

    def run(self, *args: str, tenant: str = "acme", sub: str = "bob") -> subprocess.CompletedProcess[str]:
        token = self.tokens(sub=sub, tenant=tenant, roles=["approver"])
        return toolbooth(*args, "--target", self.sidecar.target, env=cli_env(self.home, TOOLBOOTH_TOKEN=token))

    def state(self, preview_id: str) -> str:
        with sqlite3.connect(self.home / "tb.db", timeout=30) as db:
            (state,) = db.execute("SELECT state FROM previews WHERE preview_id = ?", (preview_id,)).fetchone()
        return str(state)

    def approval_attempts(self) -> list[tuple[str, str, str | None]]:
        """Each audited approval attempt: the preview id it named, its status and its error code."""
        run = toolbooth("audit", "export", "--config", str(self.home / "toolbooth.yaml"), env=cli_env(self.home))
        assert run.returncode == 0, run.stderr
        events = [json.loads(line) for line in run.stdout.splitlines()]
        return [(json.loads(e["decisions_json"])["approver"]["preview_id"], e["status"], e["error_code"])
                for e in events if "approver" in json.loads(e["decisions_json"])]


@pytest.fixture(scope="module")
def served(rsa_key: rsa.RSAPrivateKey) -> Iterator[tuple[Sidecar, Path]]:
    with approvals_sidecar(rsa_key) as running:
        yield running


@pytest.fixture
def desk(served: tuple[Sidecar, Path], make_token: Tokens) -> Desk:
    return Desk(*served, make_token)


_NOT_AMONG = "is not among the pending previews you may approve; check the id, or pass --hash"


def test_a_prefix_of_another_tenants_preview_gets_the_unknown_ids_answer(desk: Desk) -> None:
    theirs = desk.hold(tenant="globex")
    for prefix in (theirs.preview_id[:8], theirs.preview_id[:20], theirs.preview_id[:47]):
        approved = desk.run("approve", prefix, "--output", "json")
        assert approved.returncode == 3, approved.stderr
        assert _json_error(approved) == {"code": "REFUSED", "message": f"preview {prefix!r} {_NOT_AMONG}",
                                         "exit_code": 3}
        denied = desk.run("deny", prefix, "--reason", "no", "--output", "json")
        assert denied.returncode == 3, denied.stderr
        assert json.loads(denied.stdout)["error"]["code"] == "RESOURCE_NOT_FOUND"
    assert desk.state(theirs.preview_id) == "pending"


@pytest.mark.parametrize("given", ["********", "........", "[0-9a-f]*", ".*.*.*.*", "%%%%%%%%", "éééééééé",
                                   "\uff21\uff22\uff23\uff24\uff11\uff12\uff13\uff14", "0" * 300, "\u202e" + "a" * 10])
def test_a_prefix_of_no_id_is_refused_and_approves_nothing(desk: Desk, given: str) -> None:
    held = desk.hold()
    run = desk.run("approve", given, "--output", "json")
    assert run.returncode == 3 and run.stdout == "", run.stderr
    error = _json_error(run)
    assert error["code"] in ("REFUSED", "INVALID_ARGUMENT"), error
    assert desk.state(held.preview_id) == "pending"


@pytest.mark.parametrize("given", ["abc", "0123456", "a\nbcdefgh"])
def test_a_short_or_controlled_prefix_is_refused_as_json(desk: Desk, given: str) -> None:
    run = desk.run("deny", given, "--reason", "no", "--output", "json")
    assert run.returncode in (2, 3), run.stderr
    assert "Traceback" not in run.stderr and "\n" not in run.stderr.rstrip("\n")


def test_learning_why_a_preview_cannot_be_approved_approves_nothing(desk: Desk) -> None:
    own = desk.hold(sub="bob")  # bob's own call: bob may not approve it
    before = desk.approval_attempts()
    mine = desk.run("approve", own.preview_id, "--output", "json")
    assert mine.returncode == 3 and _json_error(mine)["message"] == (
        f"preview {own.preview_id!r} cannot be approved: nobody may approve their own call")
    assert desk.state(own.preview_id) == "pending"

    decided = desk.hold()
    assert desk.run("approve", decided.preview_id[:8]).returncode == 0
    again = desk.run("approve", decided.preview_id, "--output", "json")
    assert _json_error(again) == {"code": "ALREADY_DECIDED", "exit_code": 3,
                                  "message": f"preview {decided.preview_id!r} is already approved"}
    assert desk.state(decided.preview_id) == PreviewState.APPROVED.value

    attempts = desk.approval_attempts()[len(before):]  # one audited attempt per command, the real id named
    assert attempts == [(own.preview_id, "refused", "PERMISSION_DENIED"),
                        (decided.preview_id, "approved", None),
                        (decided.preview_id, "refused", "INVALID_ARGUMENT")]
