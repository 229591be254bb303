"""regorus (the embedded engine) against OPA's own engine on generated inputs: the same decision documents.

The default policies, with data that also gives tools time windows, decide generated inputs of the documented
contract (``tests.support.policy_inputs``) in both engines: each of the three decisions and the approver rule,
compared as whole documents (an evaluation error must be one in both). Each example is a batch of inputs, so
a run decides a few thousand of them in seconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config import bundled_policy_dir
from sidecar.policy.decision import CALL_STAGES, RULES
from sidecar.policy.files import PolicyFiles
from tests.support.policy_inputs import WINDOWED_TOOLS, approver_input, stage_input
from tests.support.real_opa import bindings, compiled

BATCH = 10  # inputs per example
EXAMPLES = 100  # examples per rule: 1 000 inputs each, 4 000 in all
APPROVER = "data.toolbooth.approval.approver"
CASES = {RULES[stage]: stage_input(stage.value) for stage in CALL_STAGES} | {APPROVER: approver_input()}


@dataclasses.dataclass(frozen=True)
class Engines:
    """The same policies and data, compiled by regorus and by OPA."""

    regorus: Any
    opa: Any

    def decisions(self, rule: str, input: dict[str, Any]) -> tuple[Any, Any]:
        """``rule``'s value in each engine (``None``: undefined; ``"error"``: an evaluation error)."""
        text = json.dumps(input)
        try:
            self.regorus.set_input_json(text)
            ours = self.regorus.eval_rule(rule)
        except Exception:  # noqa: BLE001 - regorus raises plain RuntimeError
            ours = "error"
        try:
            answer = self.opa.eval_query(f"x = {rule}", input)
            theirs = answer[0]["x"] if answer else None
        except bindings().OpaError:
            theirs = "error"
        return ours, theirs


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    files = PolicyFiles.read(bundled_policy_dir())
    data = json.loads(files.data or "{}")
    data["toolbooth"]["tools"] |= WINDOWED_TOOLS
    files = dataclasses.replace(files, data=json.dumps(data))
    yield Engines(files.build(), compiled(files.modules, data))


@pytest.mark.parametrize("rule", list(CASES))
def test_both_engines_decide_generated_inputs_alike(engines: Engines, rule: str) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(CASES[rule], min_size=BATCH, max_size=BATCH))
    def decide(inputs: list[dict[str, Any]]) -> None:
        for input in inputs:
            ours, theirs = engines.decisions(rule, input)
            assert ours == theirs, f"{rule}: regorus {ours!r}, OPA {theirs!r} for input {json.dumps(input)}"

    decide()
