"""A command imports only its own group; help and usage errors still list every command."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from sidecar.cli.root import COMMANDS, GROUPS, build_parser, main

# What ``serve`` has no use for: the other groups and what only they load.
NOT_FOR_SERVE = ("sidecar.cli.approvals", "sidecar.cli.policy", "sidecar.cli.audit", "sidecar.cli.tools",
                 "sidecar.cli.batch", "sidecar.cli.mcp_stdio", "sidecar.cli.config", "sidecar.cli.operations",
                 "sidecar.cli.token", "sidecar.cli.plugin_new", "sidecar.cli.bundle", "sidecar.cli.replay",
                 "sidecar.policy.devtools", "sidecar.pipeline.dry_run", "sidecar.server.roles")


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_the_table_names_every_command_in_help_order() -> None:
    assert _choices(build_parser()) == list(COMMANDS)
    assert list(dict.fromkeys(COMMANDS.values())) == list(GROUPS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_line_gets_the_commands_of_its_group_alone(command: str) -> None:
    siblings = [name for name, group in COMMANDS.items() if group == COMMANDS[command]]
    assert _choices(build_parser([command, "--help"])) == siblings


@pytest.mark.parametrize("words", [["--help"], ["--version"], ["ser"], ["-x", "serve"], []])
def test_any_other_command_line_gets_every_command(words: list[str]) -> None:
    assert _choices(build_parser(words)) == list(COMMANDS)


def test_building_the_parser_of_serve_imports_no_other_group() -> None:
    code = ("import json, sys; from sidecar.cli.root import build_parser; build_parser(['serve']); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sidecar'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert "sidecar.cli.serve" in loaded
    assert [m for m in loaded if m.startswith(NOT_FOR_SERVE)] == []


def test_help_and_an_unknown_command_list_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert re.findall(r"^    (\S+)", listed, re.MULTILINE) == list(COMMANDS), listed
    assert main(["ser"]) == 2
    assert f"choose from {', '.join(repr(command) for command in COMMANDS)}" in capsys.readouterr().err
