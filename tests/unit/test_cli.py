"""The ``toolbooth`` command line without a server: parsing, settings, ``config validate``, ``--args``."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from sidecar.cli.common import default_target, fail, read_arguments
from sidecar.cli.root import build_parser, main
from sidecar.cli.serve import cmd_serve, serve_settings
from sidecar.cli.tools import exit_code, format_table
from sidecar.config import load_settings
from sidecar.contract import SideEffect, Status, ToolDescriptor, ToolListing
from sidecar.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean(clean_env: None) -> None:
    """Every test here runs without the caller's TOOLBOOTH_* variables (``clean_env``)."""


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toolbooth.yaml"
    path.write_text(text)
    return path


# --- parsing ------------------------------------------------------------------------------------------------


def test_serve_collects_repeated_listen_flags() -> None:
    argv = ["serve", "--config", "c.yaml", "--listen", "unix:///a", "--listen", "[::1]:1"]
    args = build_parser().parse_args(argv)
    assert args.handler is cmd_serve
    assert args.config == Path("c.yaml")
    assert args.listen == ["unix:///a", "[::1]:1"]


def test_call_defaults_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLBOOTH_TOKEN", "from-env")
    parser = build_parser()
    args = parser.parse_args(["call", "calculate"])
    assert (args.tool, args.arguments, args.token, args.target, args.timeout) == ("calculate", "{}", "from-env",
                                                                                 None, None)
    args = parser.parse_args(["call", "send_email", "--args", '{"to": "x"}', "--idempotency-key", "k1",
                              "--conversation-id", "c1", "--target", "unix:///s", "--token", "t", "--timeout", "2.5"])
    assert (args.arguments, args.idempotency_key, args.conversation_id) == ('{"to": "x"}', "k1", "c1")
    assert (args.target, args.token, args.timeout) == ("unix:///s", "t", 2.5)


def test_tools_list_output_choices() -> None:
    parser = build_parser()
    assert parser.parse_args(["tools", "list"]).output == "table"
    assert parser.parse_args(["tools", "list", "--output", "json"]).output == "json"


@pytest.mark.parametrize("argv", [[], ["tools"], ["config"], ["call"], ["tools", "list", "--output", "yaml"],
                                  ["call", "calculate", "--timeout", "soon"], ["frobnicate"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: toolbooth" in capsys.readouterr().err


def test_help_exits_0_and_documents_call_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call", "--help"]) == 0
    out = capsys.readouterr().out
    assert "3  status error" in out and "4  status approval_required" in out


# --- settings -----------------------------------------------------------------------------------------------


def test_listen_flags_replace_server_listen(tmp_path: Path) -> None:
    config = _config(tmp_path, "server:\n  listen: ['127.0.0.1:5000']\n  shutdown_grace_seconds: 3\n")
    settings = serve_settings(config, ["unix:///tmp/x.sock", "127.0.0.1:0"])
    assert settings.server.listen == ("unix:///tmp/x.sock", "127.0.0.1:0")
    assert settings.server.shutdown_grace_seconds == 3
    assert serve_settings(config, None).server.listen == ("127.0.0.1:5000",)


def test_listen_flag_is_validated_like_the_config_key() -> None:
    with pytest.raises(ConfigError, match=r"server\.listen"):
        serve_settings(None, ["relative.sock"])


def test_policies_flag_picks_directory_bundle_file_or_url(tmp_path: Path) -> None:
    keys = {"keys": {"k1": {"algorithm": "HS256", "key": "secret"}}}
    config = _config(tmp_path, "policy:\n  bundle:\n    url: http://127.0.0.1:1/b.tar.gz\n    polling_seconds: 9\n"
                               f"    verification: {json.dumps(keys)}\n")
    directory = serve_settings(config, policies=str(tmp_path))
    assert directory.policy.path == tmp_path and directory.policy.bundle is None
    bundle = serve_settings(config, policies=str(tmp_path / "b.tar.gz")).policy.bundle
    assert bundle is not None and bundle.file == tmp_path / "b.tar.gz" and bundle.url is None
    assert bundle.verification is not None and bundle.polling_seconds == 9
    url = serve_settings(None, policies="https://example.test/b.tar.gz").policy.bundle
    assert url is not None and url.url == "https://example.test/b.tar.gz" and url.verification is None


def test_policies_flag_is_validated_like_the_config() -> None:
    with pytest.raises(ConfigError, match=r"policy\.bundle\.url"):
        serve_settings(None, policies="http://")


def test_serve_with_bad_config_exits_2_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "server:\n  listne: ['127.0.0.1:0']\n")
    assert main(["serve", "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.err == "toolbooth: error: config error at server.listne: unknown key (did you mean 'listen'?)\n"
    assert captured.out == ""


def test_default_target_is_where_serve_listens_by_default() -> None:
    target = default_target()
    assert target == load_settings(None).server.listen[0]
    assert target.startswith("unix:///") and target.endswith("/toolbooth.sock")


def test_default_target_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLBOOTH_TARGET", "127.0.0.1:7000")
    assert default_target() == "127.0.0.1:7000"


def test_default_target_follows_the_listen_override_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLBOOTH_SERVER__LISTEN", "['unix:///srv/tb.sock']")
    assert default_target() == "unix:///srv/tb.sock"


# --- config validate ----------------------------------------------------------------------------------------


def test_config_validate_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f"server:\n  listen: ['unix://{tmp_path}/tb.sock', '127.0.0.1:5001']\n"
                               f"store:\n  sqlite_path: {tmp_path}/tb.db\n")
    assert main(["config", "validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config OK\n")
    assert f"unix://{tmp_path}/tb.sock, 127.0.0.1:5001" in out
    assert "auth:     dev" in out
    assert f"{tmp_path}/tb.db" in out
    assert "policy:   embedded: directory " in out
    assert "mcp:" not in out  # off by default


def test_config_validate_names_the_revision_it_would_upload_to_opa(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f"server:\n  listen: ['unix://{tmp_path}/tb.sock']\n"
                               f"store:\n  sqlite_path: {tmp_path}/tb.db\n"
                               "policy:\n  engine: opa\n  opa:\n    url: http://127.0.0.1:8181\n")
    assert main(["config", "validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    expected = r"policy:   opa http://127\.0\.0\.1:8181 \(not contacted\): directory \S+, revision sha256:\w{16}\n"
    assert re.search(expected, out), out


def test_config_validate_shows_the_mcp_endpoint_and_refuses_a_public_one_in_dev_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    base = f"server:\n  listen: ['unix://{tmp_path}/tb.sock']\nstore:\n  sqlite_path: {tmp_path}/tb.db\n"
    local = _config(tmp_path, base + "mcp:\n  listen: 127.0.0.1:8765\n")
    assert main(["config", "validate", "--config", str(local)]) == 0
    assert "  mcp:      http://127.0.0.1:8765/mcp\n" in capsys.readouterr().out
    public = _config(tmp_path, base + "mcp:\n  listen: 0.0.0.0:8765\n")
    assert main(["config", "validate", "--config", str(public)]) == 2
    assert "mcp.listen: '0.0.0.0:8765' is not a loopback address; auth mode 'dev'" in capsys.readouterr().err


def test_config_validate_summarises_every_endpoint_the_workers_and_the_audit_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    config = _config(tmp_path, f"server:\n  listen: ['127.0.0.1:5001']\n  workers: 2\n"
                               f"store:\n  sqlite_path: {tmp_path}/tb.db\n"
                               "audit:\n  chain_key: a-chain-key-of-sixteen-bytes\n"
                               "mcp:\n  listen: 127.0.0.1:8765\napprovals_ui:\n  listen: 127.0.0.1:8766\n"
                               "http_json:\n  listen: 127.0.0.1:8767\nmetrics:\n  listen: 127.0.0.1:9464\n")
    assert main(["config", "validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    for line in ("  mcp:      http://127.0.0.1:8765/mcp", "  approvals_ui: http://127.0.0.1:8766/",
                 "  http_json: http://127.0.0.1:8767/v1/call", "  metrics:  http://127.0.0.1:9464/metrics",
                 "  workers:  2", "  audit:    chain keyed"):
        assert line + "\n" in out, out
    assert main(["config", "validate", "--config", str(config), "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["endpoints"] == {"mcp": "http://127.0.0.1:8765/mcp", "approvals_ui": "http://127.0.0.1:8766/",
                                     "http_json": "http://127.0.0.1:8767/v1/call",
                                     "metrics": "http://127.0.0.1:9464/metrics"}
    assert (document["workers"], document["audit_chain"]) == (2, "keyed")


@pytest.mark.parametrize(("text", "expected"), [
    ("limits:\n  max_argument_bytez: 10\n", "toolbooth: error: config error at limits.max_argument_bytez: unknown key"),
    ("limits:\n  max_argument_bytes: 0\n",
     "toolbooth: error: config error at limits.max_argument_bytes: Input should be greater than 0"),
    ("log_level: LOUD\n", "toolbooth: error: config error at log_level:"),
])
def test_config_validate_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    config = _config(tmp_path, text)
    assert main(["config", "validate", "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(expected)


def test_config_validate_reports_every_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "limits:\n  max_argument_bytes: 0\n  max_argument_depth: 0\n")
    assert main(["config", "validate", "--config", str(config)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[2].strip() for line in lines] == ["config error at limits.max_argument_bytes",
                                                               "config error at limits.max_argument_depth"]


def test_config_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_config_validate_sees_env_overrides(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TOOLBOOTH_LIMITS__MAX_RESULT_BYTES", "-1")
    assert main(["config", "validate"]) == 2
    assert "limits.max_result_bytes" in capsys.readouterr().err


# --- call arguments and results -----------------------------------------------------------------------------


def test_args_inline_text_is_passed_unparsed() -> None:
    assert read_arguments('{"operation": "add"') == '{"operation": "add"'


def test_args_from_file(tmp_path: Path) -> None:
    path = tmp_path / "args.json"
    path.write_text('{"operation": "add", "operands": [2, 3]}\n')
    assert read_arguments(f"@{path}") == '{"operation": "add", "operands": [2, 3]}\n'


def test_args_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('{"a": 1}'))
    assert read_arguments("-") == '{"a": 1}'


def test_unreadable_args_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call", "calculate", "--args", f"@{tmp_path}/missing.json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    missing = tmp_path / "missing.json"
    assert captured.err == f"toolbooth: error: cannot read --args file {missing}: No such file or directory\n"


@pytest.mark.parametrize(("status", "code"), [(Status.SUCCESS, 0), (Status.PARTIAL_SUCCESS, 0), (Status.ERROR, 3),
                                              (Status.APPROVAL_REQUIRED, 4)])
def test_exit_code_per_status(status: Status, code: int) -> None:
    assert exit_code(status) == code


def test_every_status_has_an_exit_code() -> None:
    assert {exit_code(status) for status in Status} <= {0, 3, 4}


# --- output -------------------------------------------------------------------------------------------------


def test_tools_table() -> None:
    def descriptor(name: str, side_effect: SideEffect, key: bool, timeout_ms: int) -> ToolDescriptor:
        return ToolDescriptor(name=name, version="1.2.0", description="", input_schema={}, side_effect=side_effect,
                              requires_idempotency_key=key, timeout_ms=timeout_ms)

    listing = ToolListing(tools=(descriptor("calculate", SideEffect.NONE, False, 500),
                                 descriptor("send_email", SideEffect.EXTERNAL_IRREVERSIBLE, True, 30000)),
                          policy_revision="r1")
    assert format_table(listing).splitlines() == [
        "NAME        VERSION  SIDE EFFECT            KEY REQUIRED  TIMEOUT",
        "calculate   1.2.0    none                   no            0.5s",
        "send_email  1.2.0    external_irreversible  yes           30s",
    ]


def test_tools_export_openai_names_each_tool_that_is_not_strict(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    closed = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
              "additionalProperties": False}
    open_schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 9}}, "required": ["q"]}
    listing = ToolListing(tools=tuple(
        ToolDescriptor(name=name, version="1", description="", input_schema=schema, side_effect=SideEffect.NONE,
                       requires_idempotency_key=False, timeout_ms=1000)
        for name, schema in (("search", closed), ("lookup", open_schema))), policy_revision="r1")
    monkeypatch.setattr("sidecar.cli.tools.with_client", lambda args, request: listing)
    assert main(["tools", "export", "--format", "openai"]) == 0
    out, err = capsys.readouterr()
    assert [tool["function"]["strict"] for tool in json.loads(out)] == [True, False]
    assert err == ("toolbooth: note: tool 'lookup' is not strict: #: the object must set additionalProperties: "
                   "false; #/properties/q: keyword 'maxLength' is not supported\n")


def test_fail_prefixes_every_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail("first\nsecond", 7) == 7
    assert capsys.readouterr().err == "toolbooth: error: first\ntoolbooth: error: second\n"
