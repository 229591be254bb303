"""``--output json`` on every command, JSON errors, and the shared table helper, without a server."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.cli.output import NO_RESULT, requested_json
from sidecar.cli.root import build_parser
from sidecar.cli.table import NARROWEST, Column, render_table
from sidecar.config import bundled_policy_dir, load_settings
from tests.support.tables import assert_aligned, table_columns, table_rows
from toolbooth_documents.cli import _parser as documents_parser


@pytest.fixture(autouse=True)
def _clean(clean_env: None) -> None:
    """Every test here runs without the caller's TOOLBOOTH_* variables (``clean_env``)."""


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                                        argparse.ArgumentParser]]:
    """Every command of ``parser``'s tree (the parsers without subcommands), with the words that name it."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        yield path, parser
        return
    for name, child in actions[0].choices.items():
        yield from commands(child, (*path, name))


def output_choices(parser: argparse.ArgumentParser) -> tuple[str, ...] | None:
    found = [a for a in parser._actions if "--output" in a.option_strings]
    return tuple(found[0].choices or ()) if found else None


def test_every_command_that_prints_a_result_takes_output_json() -> None:
    every = dict(commands(build_parser()))
    assert len(every) >= 20 and ("policy", "bundle", "verify") in every
    without = {" ".join(path) for path, parser in every.items() if output_choices(parser) is None}
    assert without == set(NO_RESULT), "a new command needs output_flag (sidecar.cli.output), or a NO_RESULT reason"
    for path, parser in every.items():
        if " ".join(path) not in NO_RESULT:
            assert "json" in (output_choices(parser) or ()), path


def test_every_documents_command_takes_output_json() -> None:
    every = dict(commands(documents_parser()))
    assert set(every) == {("index",), ("delete",), ("list",)}
    assert all(output_choices(parser) == ("text", "json") for parser in every.values())


def test_json_is_asked_for_before_parsing() -> None:
    assert requested_json(["tools", "list", "--output", "json"]) and requested_json(["x", "--output=json"])
    assert requested_json(["policy", "replay", "--json"])
    assert not requested_json(["tools", "list", "--output", "table"]) and not requested_json(["json"])


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return code, json.loads(err)["error"]


def test_usage_errors_are_json_with_output_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, error = error_of(capsys, "tools", "list", "--output", "json", "--bogus")
    assert (code, error) == (2, {"code": "USAGE", "exit_code": 2,
                                 "message": "toolbooth: unrecognized arguments: --bogus"})
    code, error = error_of(capsys, "call", "--output", "json")
    assert code == 2 and error["message"] == "toolbooth call: the following arguments are required: TOOL"
    code, error = error_of(capsys, "operations", "list", "--output", "json", "--config", "/no/such.yaml")
    assert code == 2 and error["code"] == "CONFIG" and "/no/such.yaml" in str(error["message"])


def test_without_output_json_usage_errors_are_argparse_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "list", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: toolbooth") and err.endswith("toolbooth: error: unrecognized arguments: --bogus\n")
    assert main(["tools", "list", "--output", "yaml"]) == 2  # not JSON: the invalid choice is said as before
    assert "argument --output: invalid choice: 'yaml' (choose from 'table', 'json')" in capsys.readouterr().err


def test_command_errors_keep_their_exit_code_and_name_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, error = error_of(capsys, "call", "calculate", "--args", "{", "--output", "json")
    assert (code, error["code"]) == (2, "USAGE") and str(error["message"]).startswith("--args is not valid JSON")
    code, error = error_of(capsys, "token", "--subject", "u", "--output", "json")
    assert (code, error["code"]) == (2, "USAGE") and "dev mode" in str(error["message"])
    code, error = error_of(capsys, "policy", "test", str(tmp_path / "absent"), "--output", "json")
    assert code == 2 and error["code"] == "USAGE"


def test_token_bundle_and_config_print_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            store_config: Callable[[Path], Path]) -> None:
    config = tmp_path / "jwt.yaml"
    config.write_text("auth:\n  mode: jwt\n  jwt:\n    algorithms: [HS256]\n    key: " + "k" * 32 + "\n"
                      "    issuer: https://issuer.test\n    audience: toolbooth\n")
    assert main(["token", "--config", str(config), "--subject", "bob", "--ttl", "60", "--output", "json"]) == 0
    token = json.loads(capsys.readouterr().out)
    assert set(token) == {"token", "subject", "expires_at"} and token["token"].count(".") == 2
    out = tmp_path / "b.tar.gz"
    assert main(["policy", "bundle", "build", str(bundled_policy_dir()), "-o", str(out), "--output", "json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert (built["file"], built["signed"], built["algorithm"]) == (str(out), False, None)
    assert built["revision"].startswith("sha256:") and built["files"] > 3
    assert main(["config", "validate", "--config", str(store_config(tmp_path / "s.db")), "--output", "json"]) == 0
    validated = json.loads(capsys.readouterr().out)
    assert validated["ok"] is True and validated["auth"] == {"mode": "dev", "jwks_url": None}
    assert "calculate" in validated["tools"] and validated["store"].startswith("sqlite")


# --- tables -------------------------------------------------------------------------------------------------


COLUMNS = [Column("ID", wrap=False), Column("TOOL"), Column("STATE", wrap=False), Column("REASON")]
ROWS = [("p_0123456789abcdef0123456789abcdef", "send_email_preview", "pending",
         "approval is configured for this tool, and the amount is above the limit of the team"),
        ("p_2", "calculate", "an_unusually_long_state_name", "ok"),
        ("p_3", "日本語のツール", "x", "[bold]not markup[/bold]\x1b[31m")]


@pytest.mark.parametrize("width", [None, 120, 60, 40, 20])
def test_a_table_fits_its_width_and_stays_aligned(width: int | None) -> None:
    table = render_table(COLUMNS, ROWS, width)
    assert_aligned(table, 4, width if width != 20 else None)
    assert "\x1b" not in table  # control characters are shown by their code points, never obeyed
    if width is None:
        assert table.splitlines()[1].split()[0] == ROWS[0][0] and len(table.splitlines()) == 4  # nothing wraps
        assert table.splitlines()[-1].endswith("[bold]not markup[/bold]⟦U+001B⟧[31m")  # no markup
    else:
        assert "…" in table or len(table.splitlines()) > 4  # cut with an ellipsis or wrapped


def test_a_table_too_narrow_for_its_columns_is_wider_than_asked_but_aligned() -> None:
    table = render_table(COLUMNS, ROWS, 10)
    starts = assert_aligned(table, 4, NARROWEST * 4 + 2 * 3)  # NARROWEST cells a column (ID: its header's 2)
    assert starts == [0, 4, 9, 14]
    rows = table_rows(table, ["ID", "TOOL", "STATE", "REASON"], anchor=0)
    assert [row[1] for row in rows] == ["send_email_preview", "calculate", "日本語のツール"]  # folded, all there


def test_headers_keep_their_words_while_the_values_can_wrap() -> None:
    table = render_table(COLUMNS, ROWS, 40)
    assert table_rows(table, ["ID", "TOOL", "STATE", "REASON"], anchor=0)[0][0].startswith("p_0")
    assert table.splitlines()[0].split() == ["ID", "TOOL", "STATE", "REASON"]  # no header word folded


def test_columns_environment_variable_sets_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    assert max(len(line) for line in render_table(COLUMNS, ROWS).splitlines()) <= 40
    for ignored in ("", "0", "wide"):
        monkeypatch.setenv("COLUMNS", ignored)
        assert render_table(COLUMNS, ROWS).splitlines()[1].split()[0] == ROWS[0][0]  # stdout is no terminal: no limit


def test_a_huge_cell_is_fitted_quickly_and_whole() -> None:
    reason = "word " * 40_000
    started = time.perf_counter()
    table = render_table(COLUMNS, [("p_1", "calculate", "pending", reason)], 80)
    assert time.perf_counter() - started < 20  # on a loaded machine; a cell at a time took far longer
    assert_aligned(table, 4, 80)
    assert table_columns(table, ["ID", "TOOL", "STATE", "REASON"])[3] == "word" * 40_000


def test_the_no_progress_variable_is_not_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLBOOTH_NO_PROGRESS", "1")
    assert load_settings(None).store is not None  # a TOOLBOOTH_* variable the settings do not know fails them
