"""One name per flag, as the user meets it: the policy directory is ``--policies`` in every command, ``policy eval``'s
principal file is ``--principal-file``; the older spellings still work, say so in ``--help`` and, on a terminal,
on stderr. The real ``toolbooth`` command, run as a process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.config import bundled_policy_dir
from tests.support.cli import ADD_2_3, run_tty_stderr, toolbooth

pytestmark = pytest.mark.integration

POLICIES = str(bundled_policy_dir())


@pytest.fixture
def principal(home: Path) -> str:
    path = home / "principal.json"
    path.write_text(json.dumps({"id": "alice", "tenant": "dev", "roles": ["developer"], "permissions": []}))
    return str(path)


@pytest.mark.parametrize("command", ["check", "test"])
def test_the_policy_directory_is_policies_and_the_positional_dir_still_works(env: dict[str, str],
                                                                             command: str) -> None:
    named = toolbooth("policy", command, "--policies", POLICIES, "--output", "json", env=env)
    positional = toolbooth("policy", command, POLICIES, "--output", "json", env=env)
    assert (named.returncode, positional.returncode) == (0, 0), named.stderr + positional.stderr
    assert json.loads(named.stdout)["ok"] is json.loads(positional.stdout)["ok"] is True
    assert positional.stderr == ""  # not a terminal: a script's stderr stays as it was


def test_policy_eval_takes_policies_and_principal_file_and_their_older_spellings(env: dict[str, str],
                                                                                 principal: str) -> None:
    call = ("policy", "eval", "--tool", "calculate", "--args", ADD_2_3, "--time", "2026-11-30T15:00:00Z",
            "--output", "json")
    new = toolbooth(*call, "--principal-file", principal, "--policies", POLICIES, env=env)
    old = toolbooth(*call, "--principal", principal, "--dir", POLICIES, env=env)
    assert (new.returncode, old.returncode) == (0, 0), new.stderr + old.stderr
    assert json.loads(new.stdout) == json.loads(old.stdout)
    assert json.loads(new.stdout)["principal"]["id"] == "alice"


def test_both_spellings_at_once_or_no_principal_is_a_usage_error(env: dict[str, str], principal: str) -> None:
    twice = toolbooth("policy", "test", POLICIES, "--policies", POLICIES, env=env)
    assert (twice.returncode, twice.stderr) == (
        2, "toolbooth: error: --policies is given twice, once in an older spelling: give it once\n")
    nobody = toolbooth("policy", "eval", "--tool", "calculate", env=env)
    assert (nobody.returncode, nobody.stderr) == (
        2, "toolbooth: error: policy eval needs --principal-file FILE: the calling principal\n")


def test_bundle_build_takes_policies_too(env: dict[str, str], home: Path) -> None:
    new = toolbooth("policy", "bundle", "build", "--policies", POLICIES, "-o", str(home / "new.tar.gz"), env=env)
    old = toolbooth("policy", "bundle", "build", POLICIES, "-o", str(home / "old.tar.gz"), env=env)
    assert (new.returncode, old.returncode) == (0, 0), new.stderr + old.stderr
    assert new.stdout.split(":", 1)[1] == old.stdout.split(":", 1)[1]  # the same revision and files


@pytest.mark.parametrize(("command", "notes"), [
    (("policy", "test"), ["deprecated: use --policies DIR"]),
    (("policy", "eval"), ["--dir DIR", "deprecated: use --policies DIR", "--principal-file FILE",
                          "deprecated: use --principal-file"]),
])
def test_help_names_the_older_spellings_as_deprecated(env: dict[str, str], command: tuple[str, ...],
                                                      notes: list[str]) -> None:
    done = toolbooth(*command, "--help", env={**env, "COLUMNS": "200"})
    assert done.returncode == 0
    for note in notes:
        assert note in done.stdout


def test_on_a_terminal_an_older_spelling_gets_a_note(env: dict[str, str]) -> None:
    run = run_tty_stderr([sys.executable, "-m", "sidecar", "policy", "check", POLICIES], env=env)
    assert run.returncode == 0, run.terminal
    assert "toolbooth: note: DIR is deprecated; use --policies DIR" in run.terminal


def test_every_command_takes_config(capsys: pytest.CaptureFixture[str]) -> None:
    commands = [("serve",), ("tools", "list"), ("tools", "export"), ("call",), ("call-batch",), ("mcp-stdio",),
                ("config", "validate"), ("policy", "test"), ("policy", "check"), ("policy", "eval"),
                ("policy", "replay"), ("policy", "status"), ("policy", "bundle", "build"), ("audit", "verify"),
                ("audit", "tail"), ("audit", "export"), ("previews", "list"), ("approve",), ("deny",),
                ("operations", "list"), ("operations", "resolve"), ("token",)]
    for command in commands:
        assert main([*command, "--help"]) == 0, command
        out = capsys.readouterr().out
        assert "--config FILE" in out and "TOOLBOOTH_CONFIG" in out, command
