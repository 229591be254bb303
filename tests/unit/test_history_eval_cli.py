"""``toolbooth policy eval --history FILE --conversation-id ID`` on the bundled policies and the installed plugins:
the given labels, meters and failures decide the call as they would in the sidecar, and a bad history file is a
usage error naming the flag, the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main

TIME = "2026-11-30T15:00:00Z"
EXTERNAL = json.dumps({"recipients": [{"email": "ana@other.org"}], "subject": "Report", "body_text": "Attached."})
INTERNAL = json.dumps({"recipients": [{"email": "ana@example.com"}], "subject": "Report", "body_text": "Attached."})
RESTRICTED = {"label": "restricted", "tool": "read_document", "time": "2026-11-30T14:00:00Z"}
FAILED = {"code": "RESOURCE_NOT_FOUND", "time": "2026-11-30T14:00:00Z"}
RATE_LIMITED = {"history": {"meters": {"writes_per_principal": {"count": 30, "retry_after_seconds": 12}}}}

Run = tuple[int, str, str]

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def admin(tmp_path: Path) -> Path:
    """A principal holding email:send_external, email:preview_send and tasks:create through the admin role."""
    path = tmp_path / "admin.json"
    path.write_text('{"id": "a1", "tenant": "acme", "roles": ["admin"], "permissions": []}')
    return path


def history_file(tmp_path: Path, document: dict[str, Any] | str, name: str = "history.json") -> Path:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Run:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def evaluate(capsys: pytest.CaptureFixture[str], principal: Path, tool: str, arguments: str,
             *extra: str | Path) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, "policy", "eval", "--tool", tool, "--principal", principal, "--args", arguments,
                         "--time", TIME, "--output", "json", *extra)
    assert err == ""
    return code, json.loads(out)


def authz(result: dict[str, Any]) -> dict[str, Any]:
    step: dict[str, Any] = result["steps"]["authz"]
    return step


# --- labels -----------------------------------------------------------------------------------------------


def test_a_restricted_label_stops_an_external_email(capsys: pytest.CaptureFixture[str], admin: Path,
                                                    tmp_path: Path) -> None:
    history = history_file(tmp_path, {"conversation": {"labels": [RESTRICTED]}})
    code, result = evaluate(capsys, admin, "send_email_preview", EXTERNAL, "--history", history,
                            "--conversation-id", "conv-1")
    assert (code, result["outcome"], result["not_reached"]) == (3, "denied", ["approval"])
    assert authz(result) == {
        "allow": False, "code": "POLICY_VIOLATION",
        "reason": 'this conversation read data labelled "restricted" (from read_document); it may not be sent '
                  "outside the organization (other.org)"}
    assert result["history"] == {"history": {"meters": {}, "failures": []},
                                 "conversation": {"id": "conv-1", "labels": [RESTRICTED]}}


def test_the_restricted_label_in_text(capsys: pytest.CaptureFixture[str], admin: Path, tmp_path: Path) -> None:
    history = history_file(tmp_path, {"conversation": {"labels": [RESTRICTED]}})
    code, out, _ = run(capsys, "policy", "eval", "--tool", "send_email_preview", "--principal", admin,
                       "--args", EXTERNAL, "--time", TIME, "--history", history, "--conversation-id", "conv-1")
    assert code == 3
    lines = out.splitlines()
    assert lines[5] == ('history:    {"history": {"meters": {}, "failures": []}, "conversation": {"id": "conv-1", '
                        '"labels": [{"label": "restricted", "tool": "read_document", '
                        '"time": "2026-11-30T14:00:00Z"}]}}')
    assert ('authz         DENY          POLICY_VIOLATION this conversation read data labelled "restricted" (from '
            "read_document); it may not be sent outside the organization (other.org)") in lines
    assert lines[-1] == "outcome: denied by the authz policy (dry run: nothing was executed)"


@pytest.mark.parametrize("history", [None, {}, {"conversation": {"labels": []}},
                                     {"conversation": {"labels": [{**RESTRICTED, "label": "untrusted"}]}}])
def test_without_the_label_the_external_email_is_not_stopped_by_it(capsys: pytest.CaptureFixture[str], admin: Path,
                                                                    tmp_path: Path,
                                                                    history: dict[str, Any] | None) -> None:
    flags: list[str | Path] = [] if history is None else ["--history", history_file(tmp_path, history)]
    code, result = evaluate(capsys, admin, "send_email_preview", EXTERNAL, *flags)
    assert (code, result["outcome"]) == (0, "would_run")
    assert authz(result) == {"allow": True, "reason": "all required permissions are held"}


def test_the_label_does_not_stop_an_internal_email(capsys: pytest.CaptureFixture[str], admin: Path,
                                                   tmp_path: Path) -> None:
    history = history_file(tmp_path, {"conversation": {"labels": [RESTRICTED]}})
    code, result = evaluate(capsys, admin, "send_email_preview", INTERNAL, "--history", history)
    assert (code, result["outcome"]) == (0, "would_run")


# --- meters -----------------------------------------------------------------------------------------------


def test_a_full_meter_rate_limits_a_write(capsys: pytest.CaptureFixture[str], admin: Path, tmp_path: Path) -> None:
    history = history_file(tmp_path, RATE_LIMITED)
    code, result = evaluate(capsys, admin, "create_task", '{"preview_id": "p1"}', "--history", history,
                            "--conversation-id", "conv-2")
    assert (code, result["outcome"], result["not_reached"]) == (3, "denied", ["approval"])
    assert authz(result) == {
        "allow": False, "code": "RATE_LIMITED", "retry_after_seconds": 12,
        "reason": "rate limit writes_per_principal reached: 30 calls per 60 seconds; retry in 12 seconds"}
    assert result["history"] == {
        "history": {"meters": {"writes_per_principal": {"count": 30, "sum": 0, "amount": 0, "window_seconds": 60,
                                                        "retry_after_seconds": 12, "reached": True}},
                    "failures": []},
        "conversation": {"id": "conv-2", "labels": []}}


def test_the_rate_limit_in_text(capsys: pytest.CaptureFixture[str], admin: Path, tmp_path: Path) -> None:
    history = history_file(tmp_path, RATE_LIMITED)
    code, out, _ = run(capsys, "policy", "eval", "--tool", "create_task", "--principal", admin,
                       "--args", '{"preview_id": "p1"}', "--history", history)
    assert code == 3
    lines = out.splitlines()
    authz_line = lines.index(next(line for line in lines if line.startswith("authz ")))
    assert lines[authz_line] == ("authz         DENY          RATE_LIMITED rate limit writes_per_principal reached: "
                                 "30 calls per 60 seconds; retry in 12 seconds")
    assert lines[authz_line + 1] == "              retry after (s): 12"
    assert lines[authz_line + 2:] == ["not reached: approval",
                                      "outcome: denied by the authz policy (dry run: nothing was executed)"]


@pytest.mark.parametrize("count", [0, 29])
def test_a_meter_with_room_lets_the_write_on(capsys: pytest.CaptureFixture[str], admin: Path, tmp_path: Path,
                                             count: int) -> None:
    history = history_file(tmp_path, {"history": {"meters": {"writes_per_principal": {"count": count}}}})
    code, result = evaluate(capsys, admin, "create_task", '{"preview_id": "p1"}', "--history", history)
    assert (code, result["outcome"]) == (4, "approval_required")  # past authz: the bundled approval holds it
    assert authz(result)["allow"] is True
    # Below its limit the bundled meter shows only that (its facts are "reached"): the decisions stay cached.
    assert result["history"]["history"]["meters"]["writes_per_principal"] == {"reached": False}


def test_a_given_meter_that_does_not_count_the_call_is_not_shown(capsys: pytest.CaptureFixture[str], admin: Path,
                                                                  tmp_path: Path) -> None:
    history = history_file(tmp_path, RATE_LIMITED)  # writes_per_principal counts writes; a preview is none
    code, result = evaluate(capsys, admin, "send_email_preview", INTERNAL, "--history", history)
    assert (code, result["outcome"]) == (0, "would_run")
    assert result["history"]["history"]["meters"] == {}


# --- failures ---------------------------------------------------------------------------------------------


def test_three_identical_failures_break_the_loop(capsys: pytest.CaptureFixture[str], admin: Path,
                                                 tmp_path: Path) -> None:
    history = history_file(tmp_path, {"history": {"failures": [FAILED, FAILED, FAILED]}})
    code, result = evaluate(capsys, admin, "send_email_preview", INTERNAL, "--history", history)
    assert (code, result["outcome"]) == (3, "denied")
    assert authz(result) == {
        "allow": False, "code": "POLICY_VIOLATION",
        "reason": "this call failed 3 times in this conversation (RESOURCE_NOT_FOUND): stop repeating it; change "
                  "its arguments or ask the user"}
    assert result["history"]["history"]["failures"] == [FAILED, FAILED, FAILED]


@pytest.mark.parametrize("failures", [[FAILED, FAILED], [FAILED, FAILED, {**FAILED, "code": "TIMEOUT"}]])
def test_fewer_identical_failures_do_not(capsys: pytest.CaptureFixture[str], admin: Path, tmp_path: Path,
                                         failures: list[dict[str, str]]) -> None:
    history = history_file(tmp_path, {"history": {"failures": failures}})
    code, result = evaluate(capsys, admin, "send_email_preview", INTERNAL, "--history", history)
    assert (code, result["outcome"]) == (0, "would_run")


# --- the history shown ------------------------------------------------------------------------------------


def test_without_a_history_file_the_decisions_read_none(capsys: pytest.CaptureFixture[str], admin: Path) -> None:
    code, result = evaluate(capsys, admin, "create_task", '{"preview_id": "p1"}', "--conversation-id", "conv-3")
    assert code == 4
    assert result["history"] == {
        "history": {"meters": {"writes_per_principal": {"reached": False}}, "failures": []},
        "conversation": {"id": "conv-3", "labels": []}}


def test_policies_reading_no_history_show_none(capsys: pytest.CaptureFixture[str], admin: Path,
                                               tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    for package, decision in (("availability", '{"allow": true}'), ("authz", '{"allow": true}'),
                              ("approval", '{"required": false}')):
        (policies / f"{package}.rego").write_text(
            f"package toolbooth.{package}\n\nimport rego.v1\n\ndefault decision := {decision}\n")
    history = history_file(tmp_path, {"conversation": {"labels": [RESTRICTED]}, **RATE_LIMITED})
    code, result = evaluate(capsys, admin, "send_email_preview", EXTERNAL, "--history", history, "--dir", policies)
    assert (code, result["outcome"]) == (0, "would_run")
    assert "history" not in result
    code, out, _ = run(capsys, "policy", "eval", "--tool", "send_email_preview", "--principal", admin, "--args",
                       EXTERNAL, "--history", history, "--dir", policies)
    assert code == 0 and "history:" not in out


# --- bad history files ------------------------------------------------------------------------------------


def test_a_missing_history_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], admin: Path,
                                                 tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    code, out, err = run(capsys, "policy", "eval", "--tool", "create_task", "--principal", admin, "--args",
                         '{"preview_id": "p1"}', "--history", missing)
    assert (code, out) == (2, "")
    assert err == f"toolbooth: error: cannot read --history file {missing}: No such file or directory\n"


def test_a_directory_as_history_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], admin: Path,
                                                      tmp_path: Path) -> None:
    code, out, err = run(capsys, "policy", "eval", "--tool", "create_task", "--principal", admin, "--args",
                         '{"preview_id": "p1"}', "--history", tmp_path)
    assert (code, out) == (2, "")
    assert err == f"toolbooth: error: cannot read --history file {tmp_path}: Is a directory\n"


@pytest.mark.parametrize(("text", "problem"), [
    ("{", "(top level): Invalid JSON: "),
    ("", "(top level): Invalid JSON: "),
    ('["restricted"]', "(top level): Input should be an object"),
    ('{"labels": [{"label": "restricted", "tool": "read_document", "time": "t"}]}',
     "labels: Extra inputs are not permitted"),
    ('{"history": {"meters": {"writes_per_principal": {"count": -1}}}}',
     "history.meters.writes_per_principal.count: Input should be greater than or equal to 0"),
    ('{"conversation": {"labels": [{"label": "restricted", "time": "t"}]}}',
     "conversation.labels.0.tool: Field required"),
    ('{"history": {"failures": [{"code": "RESOURCE_NOT_FOUND"}]}}', "history.failures.0.time: Field required"),
    ('{"history": {"failures": "RESOURCE_NOT_FOUND"}}', "history.failures: Input should be a valid array"),
])
def test_a_history_file_of_the_wrong_shape_is_a_usage_error(capsys: pytest.CaptureFixture[str], admin: Path,
                                                            tmp_path: Path, text: str, problem: str) -> None:
    history = history_file(tmp_path, text)
    code, out, err = run(capsys, "policy", "eval", "--tool", "create_task", "--principal", admin, "--args",
                         '{"preview_id": "p1"}', "--history", history)
    assert (code, out) == (2, "")
    assert err.startswith(f"toolbooth: error: --history file {history} is not a call history: {problem}"), err
    assert err.count("\n") == 1


def test_a_history_file_that_is_not_text_is_a_usage_error(capsys: pytest.CaptureFixture[str], admin: Path,
                                                          tmp_path: Path) -> None:
    history = tmp_path / "history.json"
    history.write_bytes(b'{"conversation": "\xff"}')
    code, out, err = run(capsys, "policy", "eval", "--tool", "create_task", "--principal", admin, "--args",
                         '{"preview_id": "p1"}', "--history", history)
    assert (code, out) == (2, "")
    assert err.startswith(f"toolbooth: error: --history file {history} is not a call history: "), err
