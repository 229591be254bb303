"""``toolbooth policy test | check | eval`` on good and broken policies, in text and JSON."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.config import bundled_policy_dir
from sidecar.tools.registry import Registry
from tests.support import tools

FAILING_TEST = """
test_developers_may_delete if {
	authz.decision.allow with input as call_by(["developer"], [], ["records:delete"])
		with data.toolbooth.role_permissions as roles
}
"""

UNTESTED_POLICY = """\
package toolbooth.extra

import rego.v1

limit := 3

over if {
	count(input.items) > limit
}
"""

Run = tuple[int, str, str]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TOOLBOOTH_* variables from the caller; the test tools instead of the installed plugins."""
    for name in list(os.environ):
        if name.startswith("TOOLBOOTH_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(Registry, "from_entry_points", lambda **kwargs: Registry.from_tools(tools.ALL))


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    """A writable copy of the bundled policies."""
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Run:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, Any]:
    code, out, _ = run(capsys, *argv, "--output", "json")
    return code, json.loads(out)


# --- policy test --------------------------------------------------------------------------------------------


def test_test_passes_on_the_bundled_policies_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "policy", "test")
    assert code == 0
    assert out.splitlines()[-1].startswith("PASS: ")
    assert "FAIL" not in out and "data.toolbooth" not in out


def test_test_verbose_lists_every_test(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    code, out, _ = run(capsys, "policy", "test", policies, "-v")
    assert code == 0
    assert "PASS  data.toolbooth.authz_test.test_role_permission_allows (" in out


def test_test_reads_the_policy_path_of_the_config(capsys: pytest.CaptureFixture[str], policies: Path,
                                                   tmp_path: Path) -> None:
    (policies / "authz_test.rego").write_text((policies / "authz_test.rego").read_text() + FAILING_TEST)
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"policy:\n  path: {policies}\n")
    assert run(capsys, "policy", "test", "--config", config)[0] == 1


def test_a_failing_test_is_named_and_explained(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "authz_test.rego").write_text((policies / "authz_test.rego").read_text() + FAILING_TEST)
    code, out, _ = run(capsys, "policy", "test", policies)
    assert code == 1
    lines = out.splitlines()
    failed = lines.index(next(line for line in lines if line.startswith("FAIL ")))
    assert lines[failed].startswith("FAIL  data.toolbooth.authz_test.test_developers_may_delete (")
    assert lines[failed + 1].strip().startswith("undefined; the last line evaluated was authz_test.rego:")
    assert any(line.startswith("FAIL: 1/") for line in lines)


def test_a_failing_test_in_json(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "authz_test.rego").write_text((policies / "authz_test.rego").read_text() + FAILING_TEST)
    code, report = run_json(capsys, "policy", "test", policies)
    assert code == 1
    assert report["ok"] is False
    assert report["summary"]["fail"] == 1 and report["summary"]["error"] == 0
    assert report["summary"]["pass"] == report["summary"]["total"] - 1
    failed = [test for test in report["tests"] if test["outcome"] == "fail"]
    assert [test["rule"] for test in failed] == ["data.toolbooth.authz_test.test_developers_may_delete"]
    assert failed[0]["message"].startswith("undefined; the last line evaluated was authz_test.rego:")
    assert "coverage" not in report


def test_a_syntax_error_exits_2_naming_the_file(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "approval_test.rego").write_text("package toolbooth.approval_test\n\ntest_x if {\n")
    code, out, err = run(capsys, "policy", "test", policies)
    assert (code, out) == (2, "")
    assert err.startswith(f"toolbooth: error: cannot load {policies / 'approval_test.rego'}: ")


def test_coverage_table_and_threshold_met(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    code, out, _ = run(capsys, "policy", "test", policies, "--coverage", "--threshold", "90")
    assert code == 0
    table = out[out.index("FILE "):].splitlines()
    assert [row.split()[0] for row in table] == ["FILE", "approval.rego", "authz.rego", "availability.rego", "total"]
    assert "below" not in out


def test_the_default_policies_reach_90_percent_line_coverage_in_every_file(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "policy", "test", bundled_policy_dir(), "--coverage", "--threshold", "90")
    assert code == 0, out


def test_coverage_below_threshold_fails(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "extra.rego").write_text(UNTESTED_POLICY)
    code, out, _ = run(capsys, "policy", "test", policies, "--threshold", "90")
    assert code == 1
    assert "extra.rego" in out[out.index("FILE "):]
    assert out.splitlines()[-1] == "coverage below 90%: extra.rego"
    code, report = run_json(capsys, "policy", "test", policies, "--threshold", "90")
    assert code == 1 and report["ok"] is False
    assert report["summary"]["fail"] == 0
    assert report["coverage"]["below_threshold"] == ["extra.rego"]
    extra = next(f for f in report["coverage"]["files"] if f["file"] == "extra.rego")
    assert extra == {"file": "extra.rego", "percent": 0.0, "covered": [], "not_covered": [5, 8]}


# --- policy check -------------------------------------------------------------------------------------------


def test_check_passes_on_the_bundled_policies(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "policy", "check")
    assert code == 0
    assert out.startswith(f"policy check OK: {bundled_policy_dir()}, revision sha256:")
    code, report = run_json(capsys, "policy", "check")
    assert (code, report["ok"], report["problems"]) == (0, True, [])
    assert report["samples"] == 32


def test_check_reports_a_syntax_error(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "authz.rego").write_text("package toolbooth.authz\n\ndecision := {\n")
    code, out, _ = run(capsys, "policy", "check", policies)
    assert code == 1
    assert out.startswith(f"problem: cannot load {policies / 'authz.rego'}: ")
    code, report = run_json(capsys, "policy", "check", policies)
    assert (code, report["revision"], len(report["problems"])) == (1, None, 1)


def test_check_compiles_the_tests_too(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "authz_test.rego").write_text("package toolbooth.authz_test\n\nimport rego.v1\n\ntest_x if y\n")
    code, out, _ = run(capsys, "policy", "check", policies)
    assert code == 1
    assert "authz_test.rego" in out and "unsafe" in out


def test_check_reports_a_missing_entrypoint(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "authz.rego").write_text('package toolbooth.authz\n\nimport rego.v1\n\nverdict := {"allow": true}\n')
    code, out, _ = run(capsys, "policy", "check", policies)
    assert (code, out) == (1, "problem: data.toolbooth.authz.decision is not defined\n")


def test_check_reports_a_missing_package(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "authz.rego").unlink()
    (policies / "authz_test.rego").unlink()
    code, report = run_json(capsys, "policy", "check", policies)
    assert code == 1
    assert [p["message"] for p in report["problems"]] == [
        f"policy directory {policies} does not define package(s) data.toolbooth.authz"]


def test_check_reports_a_malformed_decision_with_the_sample_inputs(capsys: pytest.CaptureFixture[str],
                                                                    policies: Path) -> None:
    (policies / "approval.rego").write_text(
        'package toolbooth.approval\n\nimport rego.v1\n\ndecision := {"required": "yes"} if input.tool.side_effect '
        '== "none"\n\ndecision := {"required": false} if input.tool.side_effect != "none"\n')
    code, out, _ = run(capsys, "policy", "check", policies)
    assert code == 1
    assert out.splitlines() == [
        "problem: data.toolbooth.approval.decision.required must be a boolean, got 'yes'",
        "  on 8 of 32 sample inputs, e.g. admin calling a 'none' tool without permissions",
    ]
    code, report = run_json(capsys, "policy", "check", policies)
    assert report["problems"] == [{"message": "data.toolbooth.approval.decision.required must be a boolean, got 'yes'",
                                   "samples": 8, "example": "admin calling a 'none' tool without permissions"}]


def test_check_reports_an_evaluation_error(capsys: pytest.CaptureFixture[str], policies: Path) -> None:
    (policies / "availability.rego").write_text(
        'package toolbooth.availability\n\nimport rego.v1\n\ndecision := {"allow": to_number(input.tool.name) > 0}\n')
    code, out, _ = run(capsys, "policy", "check", policies)
    assert code == 1
    assert out.startswith("problem: data.toolbooth.availability.decision: ")
    assert "on 32 of 32 sample inputs" in out


# --- policy eval --------------------------------------------------------------------------------------------


@pytest.fixture
def developer(tmp_path: Path) -> Path:
    path = tmp_path / "developer.json"
    path.write_text('{"id": "u1", "tenant": "acme", "roles": ["developer"], "permissions": []}')
    return path


def evaluate(capsys: pytest.CaptureFixture[str], principal: Path, tool: str, arguments: str = '{"text": "hi"}',
             *extra: str | Path) -> tuple[int, Any]:
    return run_json(capsys, "policy", "eval", "--tool", tool, "--principal", principal, "--args", arguments,
                    "--time", "2026-11-30T15:00:00Z", *extra)


def test_eval_a_call_that_would_run(capsys: pytest.CaptureFixture[str], developer: Path) -> None:
    code, result = evaluate(capsys, developer, "echo")
    assert code == 0
    assert result["outcome"] == "would_run" and result["not_reached"] == []
    assert list(result["steps"]) == ["availability", "validation", "authz", "approval"]
    assert result["steps"]["validation"] == {"valid": True, "arguments": {"text": "hi"}, "errors": []}
    assert result["steps"]["approval"]["required"] is False
    assert result["tool"]["name"] == "echo" and result["principal"]["tenant"] == "acme"
    assert result["time"] == "2026-11-30T15:00:00Z" and result["revision"].startswith("sha256:")


def test_eval_text_shows_each_step_and_the_outcome(capsys: pytest.CaptureFixture[str], developer: Path) -> None:
    code, out, _ = run(capsys, "policy", "eval", "--tool", "delete_records", "--principal", developer,
                       "--args", '{"text": "x"}')
    assert code == 3
    lines = out.splitlines()
    assert lines[0] == ("tool:       delete_records 1.0.0 (tests.support.tools), side effect none, "
                        "requires records:delete")
    assert lines[1] == "principal:  u1, tenant acme, roles developer, permissions -"
    assert lines[5] == ('history:    {"history": {"meters": {}, "failures": []}, '
                        '"conversation": {"id": null, "labels": []}}')  # the default policies read the history
    assert [line.split()[0] for line in lines[7:10]] == ["availability", "validation", "arguments:"]
    assert lines[10].split() == ["authz", "DENY", "PERMISSION_DENIED", "missing", "permission(s):", "records:delete"]
    assert lines[11:] == ["not reached: approval",
                          "outcome: denied by the authz policy (dry run: nothing was executed)"]


def test_eval_stops_at_availability(capsys: pytest.CaptureFixture[str], developer: Path) -> None:
    code, result = evaluate(capsys, developer, "admin_console")
    assert (code, result["outcome"]) == (3, "unavailable")
    assert result["not_reached"] == ["validation", "authz", "approval"]
    assert result["steps"] == {"availability": {"allow": False, "reason": "tool is not available"}}


def test_eval_approval_required(capsys: pytest.CaptureFixture[str], developer: Path) -> None:
    code, result = evaluate(capsys, developer, "send_email")
    assert (code, result["outcome"]) == (4, "approval_required")
    assert result["steps"]["approval"] == {"required": True,
                                           "reason": "the tool's effects are external and irreversible",
                                           "approver_roles": ["approver"], "preview_ttl_seconds": 900}


def test_eval_approval_without_approvers_in_the_data_is_still_required(
        capsys: pytest.CaptureFixture[str], developer: Path, policies: Path) -> None:
    data = json.loads((policies / "data.json").read_text())
    del data["toolbooth"]["approval"]["approver_roles"], data["toolbooth"]["approval"]["preview_ttl_seconds"]
    (policies / "data.json").write_text(json.dumps(data))
    code, result = evaluate(capsys, developer, "send_email", '{"text": "hi"}', "--dir", policies)
    assert (code, result["outcome"]) == (4, "approval_required")
    assert result["steps"]["approval"] == {"required": True,
                                           "reason": "the tool's effects are external and irreversible"}


def test_eval_invalid_arguments_as_the_sidecar_reports_them(capsys: pytest.CaptureFixture[str],
                                                            developer: Path) -> None:
    code, result = evaluate(capsys, developer, "echo", '{"txt": 1}')
    assert (code, result["outcome"]) == (3, "invalid_arguments")
    assert result["not_reached"] == ["authz", "approval"]
    errors = result["steps"]["validation"]["errors"]
    assert {(e["code"], e["field"], e["recovery"]) for e in errors} == {
        ("INVALID_ARGUMENT", "text", "correct_arguments"), ("INVALID_ARGUMENT", "txt", "correct_arguments")}
    code, out, _ = run(capsys, "policy", "eval", "--tool", "echo", "--principal", developer, "--args", "[]")
    assert code == 3
    assert "validation    INVALID\n              INVALID_ARGUMENT: arguments must be a JSON object, got an array" in out


def test_eval_a_malformed_decision_is_a_policy_error(capsys: pytest.CaptureFixture[str], developer: Path,
                                                     policies: Path) -> None:
    (policies / "authz.rego").write_text('package toolbooth.authz\n\nimport rego.v1\n\ndecision := {"allow": 1}\n')
    code, result = evaluate(capsys, developer, "echo", '{"text": "hi"}', "--dir", policies)
    assert (code, result["outcome"], result["not_reached"]) == (1, "policy_error", ["approval"])
    assert result["steps"]["authz"] == {"error": "data.toolbooth.authz.decision.allow must be a boolean, got 1"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--tool", "nope"], "no installed plugin provides a tool named 'nope' (installed: admin_console, "),
    (["--tool", "echo", "--dir", "/nonexistent"], "policy directory /nonexistent does not exist"),
    (["--tool", "echo", "--args", "@/nonexistent.json"], "cannot read --args file /nonexistent.json"),
])
def test_eval_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], developer: Path, argv: list[str],
                                  message: str) -> None:
    code, out, err = run(capsys, "policy", "eval", "--principal", developer, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"toolbooth: error: {message}")


@pytest.mark.parametrize(("text", "message"), [
    ("{", "is not a principal: (top level): Invalid JSON"),
    ('{"tenant": "acme", "scopes": []}', "is not a principal: id: Field required; scopes: Extra inputs"),
])
def test_eval_rejects_a_bad_principal_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str,
                                           message: str) -> None:
    principal = tmp_path / "principal.json"
    principal.write_text(text)
    code, _, err = run(capsys, "policy", "eval", "--tool", "echo", "--principal", principal)
    assert code == 2
    assert message in err


def test_eval_time_must_be_utc_rfc3339(capsys: pytest.CaptureFixture[str], developer: Path) -> None:
    code, _, err = run(capsys, "policy", "eval", "--tool", "echo", "--principal", developer, "--time", "15:00")
    assert code == 2
    assert "expected a UTC time like 2026-11-30T15:00:00Z" in err
