"""The Rego test runner: outcomes, messages, discovery and line coverage on small policy directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import PolicyLoadError
from sidecar.policy.devtools.runner import (
    CoverageReport,
    FileCoverage,
    Outcome,
    RegoTestResult,
    defined_rules,
    run_tests,
)

GREETING = """\
package greeting

import rego.v1

allow if input.user == data.greeting.friend

message := "welcome" if allow

message := msg if {
	not allow
	msg := sprintf("go away, %s", [input.user])
}
"""

GREETING_TESTS = """\
package greeting_test

import rego.v1

import data.greeting

test_friend_is_welcome if greeting.message == "welcome" with input as {"user": "alice"}
"""

STRANGER_TEST = """
test_stranger_is_sent_away if greeting.message == "go away, bob" with input as {"user": "bob"}
"""

OUTCOMES = """\
package outcomes_test

import rego.v1

import data.greeting

test_passes if greeting.allow with input as {"user": "alice"}

test_undefined if {
	print("checking", input.user)
	greeting.allow
	true
}

test_value := 5

test_false := false

test_error if to_number("abc") == 1

test_defined_twice if false

test_defined_twice if true

test_function(x) := x
"""


def write(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``, with the data the greeting policy reads."""
    for name, text in {"data.json": '{"greeting": {"friend": "alice"}}', **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def results(root: Path) -> dict[str, RegoTestResult]:
    return {test.name: test for test in run_tests(root).tests}


@pytest.fixture
def outcomes(tmp_path: Path) -> dict[str, RegoTestResult]:
    return results(write(tmp_path, {"greeting.rego": GREETING, "tests/outcomes_test.rego": OUTCOMES}))


def test_true_passes(outcomes: dict[str, RegoTestResult]) -> None:
    test = outcomes["test_passes"]
    assert (test.outcome, test.message) == (Outcome.PASS, "")
    assert (test.package, test.file, test.line, test.rule) == (
        "outcomes_test", "tests/outcomes_test.rego", 7, "data.outcomes_test.test_passes")
    assert test.duration > 0


def test_undefined_fails_naming_the_last_line_evaluated_and_what_was_printed(
        outcomes: dict[str, RegoTestResult]) -> None:
    test = outcomes["test_undefined"]
    assert test.outcome is Outcome.FAIL
    first, printed = test.message.splitlines()
    assert first == "undefined; the last line evaluated was tests/outcomes_test.rego:11: greeting.allow"
    assert printed.startswith("printed: ") and printed.endswith("outcomes_test.rego:10: checking <undefined>")


@pytest.mark.parametrize(("name", "message"), [("test_value", "5, not true"), ("test_false", "false, not true")])
def test_a_value_other_than_true_fails(outcomes: dict[str, RegoTestResult], name: str, message: str) -> None:
    assert (outcomes[name].outcome, outcomes[name].message) == (Outcome.FAIL, message)


def test_an_evaluation_error_is_an_error_with_the_clean_message(outcomes: dict[str, RegoTestResult]) -> None:
    test = outcomes["test_error"]
    assert test.outcome is Outcome.ERROR
    assert "could not parse string as number" in test.message
    assert "outcomes_test.rego:19" in test.message
    assert "Stack backtrace" not in test.message


def test_a_rule_defined_twice_is_one_test_and_functions_are_not_tests(outcomes: dict[str, RegoTestResult]) -> None:
    assert outcomes["test_defined_twice"].outcome is Outcome.PASS
    assert list(outcomes) == ["test_passes", "test_undefined", "test_value", "test_false", "test_error",
                              "test_defined_twice"]


def test_report_counts_and_passes_only_when_every_test_passes(tmp_path: Path) -> None:
    mixed = run_tests(write(tmp_path / "mixed", {"greeting.rego": GREETING, "outcomes_test.rego": OUTCOMES}))
    assert [mixed.count(o) for o in Outcome] == [2, 3, 1]
    assert not mixed.passed
    good = run_tests(write(tmp_path / "good", {"greeting.rego": GREETING, "greeting_test.rego": GREETING_TESTS}))
    assert good.passed
    assert not run_tests(write(tmp_path / "none", {"greeting.rego": GREETING})).passed


def test_tests_run_in_file_then_line_order_across_packages(tmp_path: Path) -> None:
    root = write(tmp_path, {"greeting.rego": GREETING, "b_test.rego": GREETING_TESTS,
                            "a_test.rego": GREETING_TESTS.replace("greeting_test", "other_test")})
    assert [(t.file, t.package) for t in run_tests(root).tests] == [("a_test.rego", "other_test"),
                                                                     ("b_test.rego", "greeting_test")]


# --- coverage -----------------------------------------------------------------------------------------------


def test_coverage_lists_covered_and_not_covered_lines_of_policy_files_only(tmp_path: Path) -> None:
    report = run_tests(write(tmp_path, {"greeting.rego": GREETING, "greeting_test.rego": GREETING_TESTS}))
    assert report.coverage.files == (FileCoverage("greeting.rego", covered=(5, 7, 10), not_covered=(9, 11)),)
    assert report.coverage.files[0].percent == 60.0


def test_coverage_accumulates_over_tests(tmp_path: Path) -> None:
    root = write(tmp_path, {"greeting.rego": GREETING, "greeting_test.rego": GREETING_TESTS + STRANGER_TEST})
    assert run_tests(root).coverage.files == (FileCoverage("greeting.rego", (5, 7, 9, 10, 11), ()),)


def test_files_no_test_reaches_are_not_covered(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "greeting.rego": GREETING, "greeting_test.rego": GREETING_TESTS,
        "deep/unused.rego": "package unused\n\nimport rego.v1\n\nlimit := 2\n\nover if limit > 1\n",
        "helpers.rego": "package helpers\n\nimport rego.v1\n\ndouble(n) := n * 2\n\nhalf(n) := n / 2\n",
    })
    coverage = run_tests(root).coverage
    assert coverage.files[0] == FileCoverage("deep/unused.rego", covered=(), not_covered=(5, 7))
    assert coverage.files[2] == FileCoverage("helpers.rego", covered=(), not_covered=(5, 7))
    assert coverage.percent == pytest.approx(100 * 3 / 9)
    assert coverage.below(50) == ["deep/unused.rego", "helpers.rego"]


def test_coverage_percentages_and_threshold() -> None:
    coverage = CoverageReport((FileCoverage("a.rego", (1, 2, 3), (4,)), FileCoverage("b.rego", (), ())))
    assert [f.percent for f in coverage.files] == [75.0, 100.0]
    assert coverage.percent == 75.0
    assert coverage.below(80) == ["a.rego"]
    assert coverage.below(75) == coverage.below(None) == []


# --- loading ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("broken", ["greeting.rego", "greeting_test.rego"])
def test_a_syntax_error_is_a_load_error_naming_the_file(tmp_path: Path, broken: str) -> None:
    root = write(tmp_path, {"greeting.rego": GREETING, "greeting_test.rego": GREETING_TESTS})
    (root / broken).write_text("package broken\n\nx := \n")
    with pytest.raises(PolicyLoadError, match=f"cannot load {root / broken}") as failure:
        run_tests(root)
    assert "Stack backtrace" not in str(failure.value)


def test_an_unsafe_variable_in_a_test_is_a_load_error(tmp_path: Path) -> None:
    root = write(tmp_path, {"greeting.rego": GREETING,
                            "greeting_test.rego": "package t\n\nimport rego.v1\n\ntest_x if y == 1\n"})
    with pytest.raises(PolicyLoadError, match="unsafe"):
        run_tests(root)


def test_defined_rules_names_rules_of_policies_and_tests_but_not_functions(tmp_path: Path) -> None:
    root = write(tmp_path, {"greeting.rego": GREETING + "\nshout(s) := upper(s)\n",
                            "greeting_test.rego": GREETING_TESTS})
    assert defined_rules(root) == {"data.greeting.allow", "data.greeting.message",
                                   "data.greeting_test.test_friend_is_welcome"}
