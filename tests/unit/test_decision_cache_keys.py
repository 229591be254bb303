"""The decision cache and ``input.call.idempotency_key``: left out of the key unless a policy may read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.config import bundled_policy_dir
from sidecar.contract import CallRequest, ErrorCode, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.policy import Decision, DelegatingEngine, PolicyEngine, Stage
from sidecar.policy.cache import CachingEngine
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import PolicyInput
from tests.conftest import DEVELOPER, PipelineFactory
from tests.support.history import with_meters

KEY_READING_AUTHZ = """package toolbooth.authz

import rego.v1

default decision := {"allow": true}

decision := {"allow": false, "reason": "that key is refused"} if input.call.idempotency_key == "k-refused"
"""


class RecordingEngine(DelegatingEngine):
    """Passes decisions through and keeps the stage and idempotency key of every input it was asked about."""

    def __init__(self, inner: PolicyEngine) -> None:
        super().__init__(inner)
        self.seen: list[tuple[Stage, Any]] = []

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.seen.append((stage, input.document().get("call", {}).get("idempotency_key")))
        return await self.inner.decide(stage, input)


def cached(engine: PolicyEngine) -> CachingEngine:
    return CachingEngine(engine, max_entries=100, ttl_seconds=60)


async def note(pipeline: Pipeline, key: str) -> ToolResult:
    request = CallRequest(tool="create_note", arguments_json=json.dumps({"text": "hi"}), idempotency_key=key)
    return await pipeline.execute(DEVELOPER, request)


def key_reading_policies(tmp_path: Path) -> Path:
    root = with_meters(tmp_path / "policies")  # unmetered: a metered write's counts change with every call
    (root / "authz.rego").write_text(KEY_READING_AUTHZ)
    (root / "authz_test.rego").unlink()  # tests of the bundled rules: not loaded, and no longer true
    return root


def test_the_bundled_policies_do_not_read_the_key(tmp_path: Path) -> None:
    assert not EmbeddedEngine.load(bundled_policy_dir()).reads_idempotency_key
    assert EmbeddedEngine.load(key_reading_policies(tmp_path)).reads_idempotency_key


async def test_calls_differing_only_in_their_key_share_cached_decisions(make_pipeline: PipelineFactory,
                                                                        tmp_path: Path) -> None:
    recording = RecordingEngine(EmbeddedEngine.load(with_meters(tmp_path / "unmetered")))
    pipeline = await make_pipeline(policy=cached(recording))
    for key in ("k-1", "k-2", "k-3"):
        assert (await note(pipeline, key)).status is Status.SUCCESS
    assert recording.seen == [(Stage.AVAILABILITY, None), (Stage.AUTHZ, "k-1"), (Stage.APPROVAL, "k-1")]


async def test_a_policy_reading_the_key_gets_each_key_decided(make_pipeline: PipelineFactory, tmp_path: Path) -> None:
    recording = RecordingEngine(EmbeddedEngine.load(key_reading_policies(tmp_path)))
    pipeline = await make_pipeline(policy=cached(recording))
    assert (await note(pipeline, "k-allowed")).status is Status.SUCCESS
    refused = await note(pipeline, "k-refused")
    assert refused.status is Status.ERROR and refused.error is not None
    assert refused.error.code is ErrorCode.PERMISSION_DENIED and refused.error.message == "that key is refused"
    assert (await note(pipeline, "k-allowed")).meta.idempotency_replayed  # the same key again: its stored result
    assert [key for stage, key in recording.seen if stage is Stage.AUTHZ] == ["k-allowed", "k-refused"]
