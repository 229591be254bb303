"""The documented JSON Schema of the policy input matches what the pipeline really sends."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sidecar.contract import CallRequest, Principal
from sidecar.policy import Decision, DelegatingEngine, PolicyEngine, Stage
from sidecar.policy.input import PolicyInput
from tests.conftest import ADMIN, DEVELOPER, PipelineFactory
from tests.support import tools

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "policy-input.schema.json").read_text())


class RecordingEngine(DelegatingEngine):
    """Passes decisions through and keeps every input document."""

    def __init__(self, inner: PolicyEngine) -> None:
        super().__init__(inner)
        self.seen: list[Any] = []

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.seen.append(input.document())
        return await self.inner.decide(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        return [await self.decide(stage, item) for item in inputs]


def test_the_schema_is_valid() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


async def test_every_input_the_pipeline_sends_matches(make_pipeline: PipelineFactory, default_engine: Any) -> None:
    engine = RecordingEngine(default_engine)
    pipeline = await make_pipeline(policy=engine)
    tenantless = Principal(id="svc", roles=(), permissions=("records:delete",))
    for principal in (DEVELOPER, ADMIN, tenantless):
        await pipeline.list_tools(principal, conversation_id="c-1")
        for defn in tools.ALL:
            request = CallRequest(tool=defn.name, arguments_json='{"text": "x", "count": 1}',
                                  idempotency_key="k" if defn.requires_idempotency_key else None)
            await pipeline.execute(principal, request)
    stages = {document["context"]["stage"] for document in engine.seen}
    assert stages == {"availability", "authz", "approval"} and len(engine.seen) > 50
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for document in engine.seen:
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(document)]
        assert not errors, (document, errors)


@pytest.mark.parametrize("broken", [
    {"principal": {"id": "u"}},
    {"tool": {"side_effect": "sometimes"}},
    {"context": {"stage": "availability", "time": "2026-11-30T15:00:00Z", "conversation_id": None},
     "call": {"arguments": {}, "conversation_id": None, "idempotency_key": None}},
])
def test_the_schema_rejects_other_shapes(broken: dict[str, Any]) -> None:
    document = {
        "principal": {"id": "u", "tenant": "t", "roles": [], "permissions": []},
        "tool": {"name": "t", "version": "1", "side_effect": "none", "permissions": [], "plugin": "p"},
        "context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": None},
        "call": {"arguments": {}, "conversation_id": None, "idempotency_key": None},
    }
    jsonschema.validate(document, SCHEMA)
    for key, value in broken.items():
        document[key] = value
    if broken.get("context", {}).get("stage") == "availability":
        document["call"] = broken["call"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, SCHEMA)
