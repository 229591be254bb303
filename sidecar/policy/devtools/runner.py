"""Rego policy tests, like ``opa test``, with line coverage.

``run_tests(root)`` loads a policy directory as the sidecar does (every non-test
``*.rego`` and ``data.json``), adds its ``*_test.rego`` files, and evaluates every
rule named ``test_*`` (found in regorus's AST, in any package, as ``opa test``
does; functions are not tests). A test passes iff its value is ``true``; undefined
or any other value fails; an evaluation error is an error. Line coverage of the
non-test files comes from regorus's coverage report, which lists a file only once
something in it was evaluated, with all its coverable lines; a file no test reached
is probed on a copy of the engine to learn its lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from sidecar.errors import PolicyLoadError
from sidecar.policy._regorus import regorus
from sidecar.policy.files import TEST_SUFFIX, PolicyFiles, clean_regorus_error
from sidecar.policy.shadowing import ref_path, shadowing

__all__ = ["TEST_PREFIX", "CoverageReport", "FileCoverage", "Outcome", "RegoTestReport", "RegoTestResult",
           "defined_rules", "run_tests"]

TEST_PREFIX = "test_"


class Outcome(StrEnum):
    """How one test ended."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class RegoTestResult:
    """One ``test_*`` rule's result; ``duration`` in seconds."""

    package: str
    name: str
    file: str
    line: int
    outcome: Outcome
    message: str = ""
    duration: float = 0.0

    @property
    def rule(self) -> str:
        """The rule's full path, e.g. ``data.toolbooth.authz_test.test_x``."""
        return f"data.{self.package}.{self.name}"


@dataclass(frozen=True, slots=True)
class FileCoverage:
    """Line coverage of one policy file (path relative to the policy directory)."""

    file: str
    covered: tuple[int, ...]
    not_covered: tuple[int, ...]

    @property
    def lines(self) -> int:
        """Coverable lines."""
        return len(self.covered) + len(self.not_covered)

    @property
    def percent(self) -> float:
        """Covered lines in percent (100 for a file without coverable lines)."""
        return 100.0 * len(self.covered) / self.lines if self.lines else 100.0


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Coverage of every non-test policy file, sorted by path."""

    files: tuple[FileCoverage, ...]

    def below(self, threshold: float | None) -> list[str]:
        """The files whose coverage is below ``threshold`` percent (none without a threshold)."""
        return [] if threshold is None else [f.file for f in self.files if f.percent < threshold]

    @property
    def percent(self) -> float:
        """Covered lines of all files in percent."""
        lines = sum(f.lines for f in self.files)
        return 100.0 * sum(len(f.covered) for f in self.files) / lines if lines else 100.0


@dataclass(frozen=True, slots=True)
class RegoTestReport:
    """Every test's result, in file and line order, and the coverage they reached."""

    root: Path
    tests: tuple[RegoTestResult, ...]
    coverage: CoverageReport

    def count(self, outcome: Outcome) -> int:
        """How many tests ended with ``outcome``."""
        return sum(1 for test in self.tests if test.outcome is outcome)

    @property
    def passed(self) -> bool:
        """At least one test, and every test passed."""
        return bool(self.tests) and self.count(Outcome.PASS) == len(self.tests)


@dataclass(frozen=True, slots=True)
class _Rule:
    """A rule of a module as the AST shows it; ``spans``: first and last line of each definition."""

    package: str
    name: str
    file: str
    function: bool
    spans: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class _PolicySet:
    """A compiled engine holding policies, tests and data; the rules and text of its modules by relative path."""

    root: Path
    engine: regorus.Engine
    rules: tuple[_Rule, ...]
    sources: dict[str, str]

    @classmethod
    def load(cls, root: Path) -> _PolicySet:
        """Load ``root`` as the sidecar does, plus its tests; ``PolicyLoadError`` names the file (also when a
        rule, of a test too, hides one of OPA's built-ins)."""
        files = PolicyFiles.read(root).with_tests()
        engine = files.build()
        modules = json.loads(engine.get_ast_as_json())
        if hiding := shadowing(modules):
            del engine  # gone before the raise: a regorus engine must be dropped by its thread
            raise PolicyLoadError(hiding)
        return cls(root, engine, tuple(_rules(modules, root)), dict(files.modules))

    def tests(self) -> list[_Rule]:
        """The ``test_*`` rules, in file and line order."""
        found = [r for r in self.rules if r.name.startswith(TEST_PREFIX) and not r.function]
        return sorted(found, key=lambda r: (r.file, r.spans[0]))

    def paths(self) -> set[str]:
        """``data.<package>.<rule>`` of every rule that is not a function."""
        return {f"data.{r.package}.{r.name}" for r in self.rules if not r.function}

    def policy_files(self) -> list[str]:
        """The non-test files, sorted."""
        return sorted({r.file for r in self.rules if not r.file.endswith(TEST_SUFFIX)})


def _rules(modules: list[dict[str, Any]], root: Path) -> Iterator[_Rule]:
    """Merge every module's rule definitions by package and name."""
    spans: dict[tuple[str, str, str, bool], list[tuple[int, int]]] = {}
    for module in modules:
        file = Path(module["source"]["file"]).relative_to(root).as_posix()
        text = module["source"]["contents"].encode()
        package = ".".join(ref_path(module["ast"]["package"]["refr"]))
        for rule in module["ast"]["rules"]:
            named = _rule_name(rule)
            if named is not None:
                span = next(iter(rule.values()))["span"]
                last = span["line"] + text[span["start"]:span["end"]].count(b"\n")
                spans.setdefault((package, named[0], file, named[1]), []).append((span["line"], last))
    for (package, name, file, function), found in spans.items():
        yield _Rule(package, name, file, function, tuple(found))


def _rule_name(rule: dict[str, Any]) -> tuple[str, bool] | None:
    """``(name, is a function)`` of a rule whose head is a plain name (``a.b := ...`` heads are skipped)."""
    if "Default" in rule:
        ref, function = rule["Default"]["refr"], False
    else:
        head = rule["Spec"]["head"]
        kind = next(iter(head))
        ref, function = head[kind]["refr"], kind == "Func"
    return (ref["Var"]["value"], function) if "Var" in ref else None


@dataclass
class _Lines:
    """Coverage accumulated over many evaluations: covered and seen lines per file."""

    covered: dict[str, set[int]] = field(default_factory=dict)
    seen: dict[str, set[int]] = field(default_factory=dict)

    def add(self, engine: regorus.Engine, root: Path) -> dict[str, set[int]]:
        """Add the engine's report (then clear it); return the lines this report covered."""
        report = json.loads(engine.get_coverage_report_as_json())
        engine.clear_coverage_data()
        covered = {}
        for entry in report["files"]:
            file = Path(entry["path"]).relative_to(root).as_posix()
            covered[file] = set(entry["covered"])
            self.covered.setdefault(file, set()).update(entry["covered"])
            self.seen.setdefault(file, set()).update(entry["covered"], entry["not_covered"])
        return covered


def defined_rules(root: Path) -> set[str]:
    """Compile ``root`` with its tests; the paths (``data.<package>.<rule>``) of its rules, functions left out."""
    return _PolicySet.load(Path(root)).paths()


def run_tests(root: Path, progress: Callable[[int, int], None] | None = None) -> RegoTestReport:
    """Run every ``test_*`` rule under ``root`` with coverage; ``PolicyLoadError`` if it does not load.
    ``progress`` is told, after each test, how many have run of how many there are."""
    policies = _PolicySet.load(Path(root))
    engine = policies.engine
    engine.set_enable_coverage(True)
    engine.set_gather_prints(True)
    lines = _Lines()
    rules = policies.tests()
    results = []
    for rule in rules:
        results.append(_run(policies, rule, lines))
        if progress is not None:
            progress(len(results), len(rules))
    return RegoTestReport(policies.root, tuple(results), _coverage(policies, lines))


def _run(policies: _PolicySet, rule: _Rule, lines: _Lines) -> RegoTestResult:
    engine = policies.engine
    started = time.perf_counter()
    try:
        value, error = engine.eval_rule(f"data.{rule.package}.{rule.name}"), None
    except Exception as exc:  # noqa: BLE001 - regorus raises plain RuntimeError; any failure is this test's error
        value, error = None, clean_regorus_error(exc)
    duration = time.perf_counter() - started
    reached = lines.add(engine, policies.root).get(rule.file, set())
    prints = engine.take_prints()
    result = RegoTestResult(rule.package, rule.name, rule.file, rule.spans[0][0], Outcome.PASS, duration=duration)
    if error is not None:
        return _failed(result, Outcome.ERROR, error, prints)
    if value is not True:
        return _failed(result, Outcome.FAIL, _failure(policies, rule, value, reached), prints)
    return result


def _failed(result: RegoTestResult, outcome: Outcome, message: str, prints: list[str]) -> RegoTestResult:
    """``result`` with its outcome and message, followed by what the test printed."""
    printed = "".join(f"\nprinted: {line}" for line in prints)
    return dataclasses.replace(result, outcome=outcome, message=message + printed)


def _failure(policies: _PolicySet, rule: _Rule, value: Any, reached: set[int]) -> str:
    """Why a test failed: its value, or where its body stopped (the last line of it that was evaluated)."""
    if value is not None:
        return f"{json.dumps(value)}, not true"
    last = max((n for n in reached if any(a <= n <= b for a, b in rule.spans)), default=None)
    if last is None:
        return "undefined"
    text = policies.sources[rule.file].splitlines()[last - 1].strip()
    return f"undefined; the last line evaluated was {rule.file}:{last}: {text}"


def _coverage(policies: _PolicySet, lines: _Lines) -> CoverageReport:
    """Per-file coverage of the non-test files."""
    files = policies.policy_files()
    unreached = [file for file in files if file not in lines.seen]
    probed = _probe(policies, unreached) if unreached else {}
    report = []
    for file in files:
        covered = lines.covered.get(file, set())
        coverable = lines.seen.get(file) or probed.get(file) or _first_lines(policies, file)
        report.append(FileCoverage(file, tuple(sorted(covered)), tuple(sorted(coverable - covered))))
    return CoverageReport(tuple(report))


def _probe(policies: _PolicySet, files: list[str]) -> dict[str, set[int]]:
    """The coverable lines of ``files``, learnt by evaluating their rules on a copy of the engine."""
    engine = policies.engine.clone()
    engine.set_enable_coverage(True)
    for rule in policies.rules:
        if rule.file in files and not rule.function:
            with contextlib.suppress(Exception):  # an error still marks what it reached
                engine.eval_rule(f"data.{rule.package}.{rule.name}")
    probe = _Lines()
    probe.add(engine, policies.root)
    return probe.seen


def _first_lines(policies: _PolicySet, file: str) -> set[int]:
    """The first line of every rule of ``file``: coverable lines of a file only functions make up."""
    return {span[0] for rule in policies.rules if rule.file == file for span in rule.spans}

