"""``decision_reads``: which members of a call's history (``history``, ``conversation``) the authz and approval
decisions may read, from the modules each may use; and what that does to their inputs and the decision cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.config import bundled_policy_dir
from sidecar.policy import Stage
from sidecar.policy.cache import CachingEngine
from sidecar.policy.decision import Decision
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.engine import DelegatingEngine
from sidecar.policy.files import PolicyFiles
from sidecar.policy.input import PolicyInput
from sidecar.policy.reads import decision_reads
from tests.conftest import PipelineFactory
from tests.support.history import with_meters
from tests.unit.test_pipeline import call

NOTHING: frozenset[str] = frozenset()
BOTH = frozenset({"history", "conversation"})


def reads(**modules: str) -> dict[str, frozenset[str]]:
    """What each decision may read, from modules given as ``name=text``."""
    return {stage.value: members for stage, members in
            decision_reads([(f"{name}.rego", text) for name, text in modules.items()]).items()}


def test_the_bundled_authz_reads_both_and_approval_only_the_conversation() -> None:
    assert reads(**{path.stem: text for path, text in (
        (bundled_policy_dir() / name, (bundled_policy_dir() / name).read_text())
        for name in ("authz.rego", "approval.rego", "availability.rego"))}) == {
        "authz": BOTH, "approval": frozenset({"conversation"})}


def test_a_decision_reads_what_its_package_names() -> None:
    assert reads(authz="package toolbooth.authz\nx if input.history.meters.m.count > 1\n",
                 approval="package toolbooth.approval\ny if input.tool.name == \"t\"\n") == {
        "authz": frozenset({"history"}), "approval": NOTHING}


def test_a_name_in_a_comment_is_not_read_one_in_a_string_is() -> None:
    assert reads(authz="package toolbooth.authz\n# reads no input.history, no conversation\nx := 1\n",
                 approval='package toolbooth.approval\nx := input["conversation"]\n') == {
        "authz": NOTHING, "approval": frozenset({"conversation"})}


@pytest.mark.parametrize("use", [
    "data.toolbooth.lib.too_many",  # a rule of a package it refers to
    "lib.too_many",  # through an import
    "data.toolbooth.lib[\"too_many\"]",  # indexed
    "data.toolbooth.authz.decision",  # the authz decision, whose package imports the helper
])
def test_a_decision_reads_what_the_packages_it_uses_name(use: str) -> None:
    assert reads(lib="package toolbooth.lib\ntoo_many if input.history.meters.m.count > 3\n",
                 authz="package toolbooth.authz\nimport data.toolbooth.lib\ndecision := {\"allow\": true}\n",
                 approval=f"package toolbooth.approval\nimport data.toolbooth.lib\nx if {use}\n",
                 other="package toolbooth.other\nz := input.conversation\n") == {
        "authz": frozenset({"history"}), "approval": frozenset({"history"})}


@pytest.mark.parametrize("use", ["walk(data, [p, v])", "data[k]", "x := data"])
def test_a_decision_that_reads_data_as_a_whole_reads_what_any_module_names(use: str) -> None:
    assert reads(approval=f"package toolbooth.approval\ny if {{ {use} }}\n",
                 other="package other\nz := input.conversation\n")["approval"] == frozenset({"conversation"})


def test_data_in_a_string_or_as_a_field_is_no_reference() -> None:
    assert reads(approval='package toolbooth.approval\nreason := "read restricted data"\nx := input.data\n',
                 other="package other\nz := input.conversation\n")["approval"] == NOTHING


class Counting(DelegatingEngine):
    """Counts the decisions the wrapped engine makes, by stage."""

    def __init__(self, inner: EmbeddedEngine) -> None:
        super().__init__(inner)
        self.made: dict[Stage, int] = {}
        self.inputs: dict[Stage, dict[str, object]] = {}

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.made[stage] = self.made.get(stage, 0) + 1
        self.inputs[stage] = json.loads(input.json)
        return await self.inner.decide(stage, input)


async def test_an_approval_that_reads_no_meter_stays_cached_while_the_count_changes(
        make_pipeline: PipelineFactory, tmp_path: Path) -> None:
    policies = with_meters(tmp_path / "policies", {"calls": {"by": ["principal"], "window_seconds": 60,
                                                             "limit": 1000}})
    assert decision_reads(PolicyFiles.read(policies).modules)[Stage.APPROVAL] == frozenset({"conversation"})
    counting = Counting(EmbeddedEngine.load(policies))
    pipeline = await make_pipeline(policy=CachingEngine(counting, max_entries=100, ttl_seconds=60))
    for _ in range(3):
        result = await call(pipeline, "echo", {"text": "same"}, conversation_id="c")
        assert result.error is None, result
    assert counting.made[Stage.AUTHZ] == 3  # its input carries the count, new every call
    assert counting.made[Stage.APPROVAL] == 1
    assert set(counting.inputs[Stage.APPROVAL]) >= {"conversation"}
    assert "history" not in counting.inputs[Stage.APPROVAL] and "history" in counting.inputs[Stage.AUTHZ]
