"""``toolbooth call-batch`` without a server: reading the calls of FILE, the messages for a bad one, exit codes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sidecar.cli.batch import batch_exit_code, read_calls
from sidecar.cli.root import build_parser, main
from sidecar.contract import CallRequest, Status


@pytest.fixture(autouse=True)
def _clean(clean_env: None) -> None:
    """Every test here runs without the caller's TOOLBOOTH_* variables (``clean_env``)."""


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "calls.json"
    path.write_text(text)
    return str(path)


ADD = CallRequest(tool="calculate", arguments_json='{"operation":"add","operands":[2,3]}')


def test_a_json_array_of_calls(tmp_path: Path) -> None:
    text = ('[{"tool": "calculate", "arguments": {"operation": "add", "operands": [2, 3]}},\n'
            ' {"tool": "create_note", "arguments": {"text": "é"}, "idempotency_key": "k-1", "call_id": "c-2",\n'
            '  "conversation_id": "conv", "approval_id": "p-1"},\n {"tool": "echo"}]')
    assert read_calls(_file(tmp_path, text)) == [
        ADD,
        CallRequest(tool="create_note", arguments_json='{"text":"é"}', idempotency_key="k-1", call_id="c-2",
                    conversation_id="conv", approval_id="p-1"),
        CallRequest(tool="echo", arguments_json="{}"),
    ]


def test_json_lines_with_blank_lines_and_from_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = '{"tool": "calculate", "arguments": {"operation": "add", "operands": [2, 3]}}\n\n{"tool": "echo"}\n'
    expected = [ADD, CallRequest(tool="echo", arguments_json="{}")]
    assert read_calls(_file(tmp_path, text)) == expected
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert read_calls("-") == expected


def test_arguments_that_are_not_an_object_are_sent_for_the_sidecar_to_refuse(tmp_path: Path) -> None:
    assert read_calls(_file(tmp_path, '{"tool": "echo", "arguments": [1]}')) == [
        CallRequest(tool="echo", arguments_json="[1]")]


@pytest.mark.parametrize(("text", "message"), [
    ('{"tool": "echo"}\n{"tool": \n', 'line 2 is not valid JSON: Expecting value at column 10 (FILE holds a JSON '
                                      'array of calls or one call per line)'),
    ('[{"tool": "echo"}, 3]', "calls[1]: a call must be a JSON object, got int"),
    ('"echo"', "line 1: a call must be a JSON object, got str"),
    ('[{"tool": "echo", "argumnets": {}}]', "calls[0]: unknown key 'argumnets' (a call has tool, arguments, "
                                            "idempotency_key, approval_id, conversation_id, call_id)"),
    ('[{"arguments": {}}]', 'calls[0]: "tool" must be a non-empty string'),
    ('{"tool": ""}', 'line 1: "tool" must be a non-empty string'),
    ('{"tool": "echo", "idempotency_key": 7}', "line 1: 'idempotency_key' must be a string"),
    ("[]", "no calls"),
    ("\n\n", "no calls"),
], ids=["broken line", "not an object", "a bare string", "unknown key", "no tool", "empty tool", "key not text",
        "empty array", "empty file"])
def test_a_file_that_is_not_a_list_of_calls_is_a_usage_error_saying_where(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    path = _file(tmp_path, text)
    assert main(["call-batch", path, "--target", "unix:///nowhere"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"toolbooth: error: {path}: {message}\n"


def test_an_unreadable_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.jsonl"
    assert main(["call-batch", str(missing)]) == 2
    assert capsys.readouterr().err == f"toolbooth: error: cannot read {missing}: No such file or directory\n"


def test_a_negative_concurrency_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call-batch", _file(tmp_path, '{"tool": "echo"}'), "--max-concurrency", "-1"]) == 2
    assert capsys.readouterr().err == "toolbooth: error: --max-concurrency must be 0 or more\n"


def test_flags() -> None:
    args = build_parser().parse_args(["call-batch", "calls.jsonl"])
    assert (args.file, args.max_concurrency, args.cancel_on_permanent_failure, args.timeout) == (
        "calls.jsonl", 0, False, None)
    args = build_parser().parse_args(["call-batch", "-", "--max-concurrency", "4", "--cancel-on-permanent-failure",
                                      "--timeout", "3"])
    assert (args.file, args.max_concurrency, args.cancel_on_permanent_failure, args.timeout) == ("-", 4, True, 3.0)


@pytest.mark.parametrize(("statuses", "code"), [
    ([Status.SUCCESS, Status.PARTIAL_SUCCESS], 0),
    ([Status.SUCCESS, Status.APPROVAL_REQUIRED], 4),
    ([Status.APPROVAL_REQUIRED, Status.ERROR, Status.SUCCESS], 3),
])
def test_the_exit_code_is_calls_for_the_worst_result(statuses: list[Status], code: int) -> None:
    assert batch_exit_code(statuses) == code
