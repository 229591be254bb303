"""``data.toolbooth.history``: every malformed declaration is refused with a message that says where and what, when
parsed and when a policy directory loads (``EmbeddedEngine.load``, ``toolbooth policy check``); a valid one reads
as the meters and words its policy set declares and mentions."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.config import bundled_policy_dir
from sidecar.contract import SideEffect
from sidecar.errors import MalformedDecisionError, PolicyLoadError
from sidecar.policy import Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.files import checked_files
from sidecar.policy.history import (
    MAX_WINDOW_SECONDS,
    NO_HISTORY,
    HistoryNeeds,
    Meter,
    MeterFacts,
    MeterKey,
    parse_history_needs,
)
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.history import with_meters

REPO = Path(__file__).resolve().parents[2]
WHERE = "data.toolbooth.history.meters.m"
GOOD = {"by": ["principal"], "window_seconds": 60}
KNOWN_EFFECTS = "external_irreversible, external_reversible, internal_reversible, none"

ALLOWING = {
    "availability.rego": 'package toolbooth.availability\n\nimport rego.v1\n\ndefault decision := {"allow": true}\n',
    "authz.rego": 'package toolbooth.authz\n\nimport rego.v1\n\ndefault decision := {"allow": true}\n',
    "approval.rego": 'package toolbooth.approval\n\nimport rego.v1\n\ndefault decision := {"required": false}\n',
}


def never(word: str) -> bool:
    return False


def parsed(value: Any, mentions: Callable[[str], bool] = never) -> HistoryNeeds:
    return parse_history_needs(value, mentions)


def refusal(value: Any) -> str:
    with pytest.raises(MalformedDecisionError) as refused:
        parsed(value)
    return str(refused.value)


def meter(**spec: Any) -> dict[str, Any]:
    """A history declaration whose only meter ``m`` is ``GOOD`` with ``spec`` (a value ``...`` removes the key)."""
    merged = {**GOOD, **spec}
    return {"meters": {"m": {key: value for key, value in merged.items() if value is not ...}}}


def allowing_policies(root: Path, *, data: dict[str, Any] | None = None, comment: str = "") -> Path:
    """A policy set that allows everything and reads no history, unless ``data`` or ``comment`` make it."""
    root.mkdir()
    for name, text in ALLOWING.items():
        (root / name).write_text(text + (f"\n# {comment}\n" if comment else ""))
    if data is not None:
        (root / "data.json").write_text(json.dumps(data))
    return root


# --- the shape of data.toolbooth.history and its meters ---------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    (5, "data.toolbooth.history must be an object, got 5"),
    ([], "data.toolbooth.history must be an object, got []"),
    ("meters", "data.toolbooth.history must be an object, got 'meters'"),
    ({"meters": []}, "data.toolbooth.history.meters must be an object of meters by name, got []"),
    ({"meters": "m"}, "data.toolbooth.history.meters must be an object of meters by name, got 'm'"),
    ({"meters": {"m": 60}}, f"{WHERE} must be an object, got 60"),
    ({"meters": {"m": ["principal"]}}, f"{WHERE} must be an object, got ['principal']"),
    ({"meters": {"m": None}}, f"{WHERE} must be an object, got None"),
])
def test_a_history_or_meter_that_is_not_an_object_is_refused(value: Any, message: str) -> None:
    assert refusal(value) == message


@pytest.mark.parametrize(("by", "shown"), [
    (..., "None"),
    ([], "[]"),
    ("principal", "'principal'"),
    ({"principal": True}, "{'principal': True}"),
    (["principal", "team"], "['principal', 'team']"),
    (["Principal"], "['Principal']"),
    ([1], "[1]"),
    (["tool", "principal", "tool"], "['tool', 'principal', 'tool']"),
])
def test_by_must_list_known_keys_each_once(by: Any, shown: str) -> None:
    message = refusal(meter(by=by))
    head, tail = f"{WHERE}.by must list one or more of ", f", each once, got {shown}"
    assert message.startswith(head) and message.endswith(tail), message
    assert sorted(message.removeprefix(head).removesuffix(tail).split(", ")) == sorted(key.value for key in MeterKey)


def test_the_keys_by_may_list_are_named_in_the_same_order_in_every_process() -> None:
    """The message a user sees does not depend on the process's string hashing (PYTHONHASHSEED)."""
    script = ("from sidecar.errors import MalformedDecisionError\n"
              "from sidecar.policy.history import parse_history_needs\n"
              "try:\n"
              "    parse_history_needs({'meters': {'m': {'by': []}}}, lambda word: False)\n"
              "except MalformedDecisionError as exc:\n"
              "    print(exc)\n")
    messages = set()
    for seed in ("1", "2", "3", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=60, check=True)
        messages.add(ran.stdout.strip())
    assert len(messages) == 1, f"the same declaration is explained differently by different processes: {messages}"


@pytest.mark.parametrize(("window", "shown"), [
    (..., "None"),
    (0, "0"),
    (-60, "-60"),
    (True, "True"),
    (60.0, "60.0"),
    (0.5, "0.5"),
    ("60", "'60'"),
    (MAX_WINDOW_SECONDS + 1, str(MAX_WINDOW_SECONDS + 1)),
])
def test_window_seconds_must_be_a_whole_number_within_the_maximum(window: Any, shown: str) -> None:
    assert refusal(meter(window_seconds=window)) == (
        f"{WHERE}.window_seconds must be a whole number of seconds, 1-{MAX_WINDOW_SECONDS}, got {shown}")


def test_window_seconds_may_be_one_second_up_to_the_maximum() -> None:
    assert parsed(meter(window_seconds=1)).meters[0].window_seconds == 1
    assert parsed(meter(window_seconds=MAX_WINDOW_SECONDS)).meters[0].window_seconds == MAX_WINDOW_SECONDS == 31622400


@pytest.mark.parametrize(("key", "names", "shown"), [
    ("tools", "echo", "'echo'"),
    ("tools", {"echo": True}, "{'echo': True}"),
    ("tools", ["echo", ""], "['echo', '']"),
    ("tools", ["echo", 3], "['echo', 3]"),
    ("side_effects", "none", "'none'"),
    ("side_effects", [""], "['']"),
    ("side_effects", [1], "[1]"),
])
def test_tools_and_side_effects_must_be_lists_of_names(key: str, names: Any, shown: str) -> None:
    assert refusal(meter(**{key: names})) == f"{WHERE}.{key} must be a list of names, got {shown}"


def test_an_unknown_side_effect_is_named_with_the_known_ones() -> None:
    assert refusal(meter(side_effects=["none", "external", "internal"])) == (
        f"{WHERE}.side_effects: unknown side effect(s) external, internal; known: {KNOWN_EFFECTS}")
    assert KNOWN_EFFECTS == ", ".join(sorted(effect.value for effect in SideEffect))


@pytest.mark.parametrize(("pointer", "shown"), [
    (3, "3"),
    (True, "True"),
    (["amount"], "['amount']"),
    ("amount", "'amount'"),
    ("", "''"),
    ("#/amount", "'#/amount'"),
])
def test_sum_must_be_a_json_pointer(pointer: Any, shown: str) -> None:
    assert refusal(meter(sum=pointer)) == (
        f"{WHERE}.sum must be a JSON pointer into the arguments (\"/amount\"), got {shown}")


def test_a_long_value_is_shown_shortened() -> None:
    message = refusal(meter(tools=["x" * 200, 3]))
    assert message.startswith(f"{WHERE}.tools must be a list of names, got ['xxx")
    assert message.endswith("...") and len(message.split("got ", 1)[1]) == 80


def test_the_first_malformed_meter_by_name_is_reported() -> None:
    value = {"meters": {"b": {"by": []}, "a": {"by": ["tool"], "window_seconds": 0}}}
    assert refusal(value).startswith("data.toolbooth.history.meters.a.window_seconds ")


# --- a valid declaration ----------------------------------------------------------------------------------


def test_a_valid_declaration_reads_as_its_meters() -> None:
    value = {
        "meters": {
            "writes": {"by": ["tool", "principal"], "window_seconds": 60, "limit": 30, "note": {"any": "thing"}},
            "amounts": {"by": ["conversation", "tenant"], "window_seconds": 3600, "tools": ["pay", "refund", "pay"],
                        "side_effects": ["external_irreversible", "none"], "sum": "/amount/value", "limit": 1000},
        },
        "loop_after_failures": 3,
    }
    needs = parsed(value)
    assert needs.meters == (
        Meter("amounts", (MeterKey.CONVERSATION, MeterKey.TENANT), 3600, frozenset({"pay", "refund"}),
              frozenset({SideEffect.EXTERNAL_IRREVERSIBLE, SideEffect.NONE}), "/amount/value", 1000.0),
        Meter("writes", (MeterKey.TOOL, MeterKey.PRINCIPAL), 60, limit=30.0),
    )
    amounts, writes = needs.meters
    assert isinstance(amounts.tools, frozenset) and isinstance(amounts.side_effects, frozenset)
    assert writes.tools is None and writes.side_effects is None and writes.sum is None
    assert needs.any and not needs.labels and not needs.failures and not needs.conversation


def test_a_meter_counts_the_calls_its_filters_let_through() -> None:
    [filtered] = parsed(meter(tools=["pay"], side_effects=["external_irreversible"])).meters
    assert filtered.applies("pay", SideEffect.EXTERNAL_IRREVERSIBLE)
    assert not filtered.applies("pay", SideEffect.NONE)
    assert not filtered.applies("refund", SideEffect.EXTERNAL_IRREVERSIBLE)
    [unfiltered] = parsed(meter()).meters
    assert all(unfiltered.applies("any", effect) for effect in SideEffect)
    [nothing] = parsed(meter(tools=[])).meters
    assert nothing.tools == frozenset() and not nothing.applies("pay", SideEffect.NONE)


@pytest.mark.parametrize("value", [None, {}, {"meters": None}, {"meters": {}}, {"loop_after_failures": 3}])
def test_no_declaration_and_no_mention_is_no_history(value: Any) -> None:
    needs = parsed(value)
    assert needs == NO_HISTORY == HistoryNeeds()
    assert not needs.any and not needs.conversation


@pytest.mark.parametrize(("words", "labels", "failures"), [
    ({"labels"}, True, False),
    ({"failures"}, False, True),
    ({"labels", "failures"}, True, True),
    ({"label", "failure", "meters"}, False, False),
])
def test_labels_and_failures_are_read_where_they_are_mentioned(words: set[str], labels: bool,
                                                                 failures: bool) -> None:
    asked: list[str] = []

    def mentions(word: str) -> bool:
        asked.append(word)
        return word in words

    needs = parsed(None, mentions)
    assert (needs.labels, needs.failures, needs.meters) == (labels, failures, ())
    assert needs.any is (labels or failures) and needs.conversation is (labels or failures)
    assert sorted(asked) == ["failures", "labels"]


# --- through a policy directory ---------------------------------------------------------------------------


def broken(root: Path, spec: Any) -> Path:
    """The bundled policies with one more meter, ``broken``, declared as ``spec``."""
    copy = Path(shutil.copytree(bundled_policy_dir(), root))
    data = json.loads((copy / "data.json").read_text())
    data["toolbooth"]["history"]["meters"]["broken"] = spec
    (copy / "data.json").write_text(json.dumps(data))
    return copy


BROKEN = [
    ({"by": ["principal"], "window_seconds": 0},
     "data.toolbooth.history.meters.broken.window_seconds must be a whole number of seconds, 1-31622400, got 0"),
    ({"by": ["principal"], "window_seconds": 60, "side_effects": ["writes"]},
     f"data.toolbooth.history.meters.broken.side_effects: unknown side effect(s) writes; known: {KNOWN_EFFECTS}"),
    ({"by": ["principal"], "window_seconds": 60, "sum": "amount"},
     "data.toolbooth.history.meters.broken.sum must be a JSON pointer into the arguments (\"/amount\"), "
     "got 'amount'"),
    ([60], "data.toolbooth.history.meters.broken must be an object, got [60]"),
]


@pytest.mark.parametrize(("spec", "problem"), BROKEN)
def test_a_policy_directory_with_a_broken_meter_does_not_load(tmp_path: Path, spec: Any, problem: str) -> None:
    root = broken(tmp_path / "policies", spec)
    for load in (EmbeddedEngine.load, checked_files):
        with pytest.raises(PolicyLoadError) as refused:
            load(root)
        assert str(refused.value) == f"policy directory {root}: {problem}"


@pytest.mark.parametrize(("history", "problem"), [
    ([], "data.toolbooth.history must be an object, got []"),
    ({"meters": ["writes"]}, "data.toolbooth.history.meters must be an object of meters by name, got ['writes']"),
])
def test_a_policy_directory_whose_history_is_not_an_object_does_not_load(tmp_path: Path, history: Any,
                                                                           problem: str) -> None:
    root = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    data = json.loads((root / "data.json").read_text())
    data["toolbooth"]["history"] = history
    (root / "data.json").write_text(json.dumps(data))
    with pytest.raises(PolicyLoadError) as refused:
        EmbeddedEngine.load(root)
    assert str(refused.value) == f"policy directory {root}: {problem}"


def test_a_history_declared_by_a_rule_is_checked_too(tmp_path: Path) -> None:
    root = allowing_policies(tmp_path / "policies")
    (root / "history.rego").write_text('package toolbooth.history\n\nimport rego.v1\n\n'
                                       'meters := {"m": {"by": ["principal"], "window_seconds": -1}}\n')
    with pytest.raises(PolicyLoadError) as refused:
        checked_files(root)
    assert str(refused.value) == (f"policy directory {root}: {WHERE}.window_seconds must be a whole number of "
                                  f"seconds, 1-{MAX_WINDOW_SECONDS}, got -1")


@pytest.fixture
def only_test_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TOOLBOOTH_* variables from the caller; the test tools instead of the installed plugins."""
    for name in list(os.environ):
        if name.startswith("TOOLBOOTH_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(Registry, "from_entry_points", lambda **kwargs: Registry.from_tools(tools.ALL))


@pytest.mark.parametrize(("spec", "problem"), BROKEN)
@pytest.mark.usefixtures("only_test_tools")
def test_policy_check_reports_a_broken_meter(capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: Any,
                                             problem: str) -> None:
    root = broken(tmp_path / "policies", spec)
    code = main(["policy", "check", str(root)])
    out, _ = capsys.readouterr()
    assert (code, out) == (1, f"problem: policy directory {root}: {problem}\n")  # 1: a problem, loading included
    code = main(["policy", "check", str(root), "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    assert (code, report["ok"], report["revision"]) == (1, False, None)
    assert [p["message"] for p in report["problems"]] == [f"policy directory {root}: {problem}"]


@pytest.mark.usefixtures("only_test_tools")
def test_policy_eval_on_a_broken_meter_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec, problem = BROKEN[0]
    root = broken(tmp_path / "policies", spec)
    principal = tmp_path / "principal.json"
    principal.write_text('{"id": "u1", "tenant": "acme", "roles": ["developer"], "permissions": []}')
    code = main(["policy", "eval", "--tool", "echo", "--principal", str(principal), "--args", '{"text": "hi"}',
                 "--dir", str(root)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == f"toolbooth: error: policy directory {root}: {problem}\n"


# --- what a loaded set reads ------------------------------------------------------------------------------


async def test_the_bundled_policies_read_their_meter_labels_and_failures() -> None:
    engine = EmbeddedEngine.load(bundled_policy_dir())
    try:
        needs = await engine.history_needs()
    finally:
        await engine.aclose()
    assert [m.name for m in needs.meters] == list(
        json.loads((bundled_policy_dir() / "data.json").read_text())["toolbooth"]["history"]["meters"])
    assert needs.labels and needs.failures and needs.any


async def test_a_policy_set_reading_no_history_reads_no_history(tmp_path: Path) -> None:
    engine = EmbeddedEngine.load(allowing_policies(tmp_path / "policies"))
    try:
        needs = await engine.history_needs()
    finally:
        await engine.aclose()
    assert dataclasses.replace(needs, reads=None) == NO_HISTORY and not needs.any
    assert needs.members(Stage.AUTHZ) == needs.members(Stage.APPROVAL) == frozenset()


@pytest.mark.parametrize(("comment", "data", "expected"), [
    ("reads input.conversation.labels", None, HistoryNeeds(labels=True)),
    ("reads input.history.failures", None, HistoryNeeds(failures=True)),
    ("", {"notes": ["labels", "failures"]}, HistoryNeeds(labels=True, failures=True)),
    ("", {"toolbooth": {"history": {"meters": {"m": GOOD}}}},
     HistoryNeeds(meters=(Meter("m", (MeterKey.PRINCIPAL,), 60),))),
])
async def test_what_a_policy_set_reads_follows_its_modules_and_data(tmp_path: Path, comment: str,
                                                                    data: dict[str, Any] | None,
                                                                    expected: HistoryNeeds) -> None:
    engine = EmbeddedEngine.load(allowing_policies(tmp_path / "policies", data=data, comment=comment))
    try:
        assert dataclasses.replace(await engine.history_needs(), reads=None) == expected
    finally:
        await engine.aclose()


async def test_unmetered_bundled_policies_still_read_labels_and_failures(tmp_path: Path) -> None:
    engine = EmbeddedEngine.load(with_meters(tmp_path / "policies"))
    try:
        needs = await engine.history_needs()
    finally:
        await engine.aclose()
    assert needs.meters == () and needs.labels and needs.failures


@pytest.mark.parametrize("limit", ["3", True, -1, [3]], ids=["string", "bool", "negative", "list"])
def test_a_limit_the_policies_could_not_compare_is_refused(limit: object) -> None:
    """A limit of the wrong type would make the default rule skip its meter: the limit silently off."""
    declaration = {"meters": {"writes": {"by": ["principal"], "window_seconds": 60, "limit": limit}}}
    with pytest.raises(MalformedDecisionError) as refused:
        parse_history_needs(declaration, lambda word: False)
    assert str(refused.value) == ("data.toolbooth.history.meters.writes.limit, which the policies compare counts and "
                                  f"sums with, must be a number of 0 or more, got {limit!r}")


@pytest.mark.parametrize(("facts", "shown"), [("count", "'count'"), (None, "None"), (["reached"], "['reached']")])
def test_facts_must_be_counts_or_reached(facts: Any, shown: str) -> None:
    assert refusal(meter(limit=3, facts=facts)) == ("data.toolbooth.history.meters.m.facts must be one of counts, "
                                                    f"reached, got {shown}")


def test_facts_reached_needs_a_limit() -> None:
    assert refusal(meter(facts="reached")) == ('data.toolbooth.history.meters.m.facts is "reached", which needs a '
                                               "limit: the meter has none")


def test_facts_default_to_counts_and_reached_is_read() -> None:
    counts, reached = parsed(meter(limit=3)).meters[0], parsed(meter(limit=3, facts="reached")).meters[0]
    assert (counts.facts, reached.facts) == (MeterFacts.COUNTS, MeterFacts.REACHED)
