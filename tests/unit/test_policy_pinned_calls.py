"""A call's decisions come from one policy set, even when a reload swaps another in while it is decided."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from sidecar.config import PolicySettings, bundled_policy_dir
from sidecar.contract import CallRequest, ErrorCode, Status, ToolResult
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.order import Stages
from sidecar.policy import Decision, DelegatingEngine, PolicyInput, Stage
from sidecar.policy.factory import policy_source
from sidecar.policy.input import InputBatch
from sidecar.policy.reload import ReloadingEngine
from tests.conftest import DEVELOPER, PipelineFactory
from tests.support.reloading import rewrite


class ReloadsDuringAuthz(DelegatingEngine):
    """The first policy set: while it decides a call's authz, the policies change and are reloaded."""

    reloader: ReloadingEngine

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        if stage is Stage.AUTHZ and not hasattr(self, "reloaded"):
            self.reloaded = await self.reloader.reload_if_changed()
        return await self.inner.decide(stage, input)


async def test_a_reload_during_a_call_does_not_reach_its_later_decisions(make_pipeline: PipelineFactory,
                                                                         tmp_path: Path) -> None:
    policies = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    source = policy_source(PolicySettings(path=policies))
    first = ReloadsDuringAuthz(await source.load())
    reloader = first.reloader = ReloadingEngine(source, first, await source.fingerprint())
    data = json.loads((policies / "data.json").read_text())
    data["toolbooth"]["approval"]["tools"].append("echo")  # the next set: echo needs approval
    rewrite(policies / "data.json", json.dumps(data))
    pipeline = await make_pipeline(policy=reloader)

    during = await pipeline.execute(DEVELOPER, CallRequest(tool="echo", arguments_json='{"text": "hi"}'))
    assert first.reloaded.revision != first.revision == during.meta.policy_revision
    assert during.status is Status.SUCCESS  # its approval decision came from its own set, as its authz did
    after = await pipeline.execute(DEVELOPER, CallRequest(tool="echo", arguments_json='{"text": "hi"}'))
    assert after.meta.policy_revision == first.reloaded.revision
    assert after.error is not None and after.error.code is ErrorCode.APPROVAL_REQUIRED


class ReloadsFirst:
    """A stage before the decisions that reloads the policies: the call was made under one set, decided under
    the next."""

    def __init__(self) -> None:
        self.reloader: ReloadingEngine | None = None

    async def run(self, call: Call, next: Next) -> ToolResult:
        assert self.reloader is not None
        await self.reloader.reload_if_changed()
        return await next(call)


async def test_a_call_records_the_revision_its_decisions_came_from(make_pipeline: PipelineFactory,
                                                                   tmp_path: Path) -> None:
    policies = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    source = policy_source(PolicySettings(path=policies))
    first = await source.load()
    reloader = ReloadingEngine(source, first, await source.fingerprint())
    data = json.loads((policies / "data.json").read_text())
    data["toolbooth"]["approval"]["tools"].append("echo")  # the next set: echo needs approval
    rewrite(policies / "data.json", json.dumps(data))
    stage = ReloadsFirst()
    stage.reloader = reloader
    pipeline = await make_pipeline(policy=reloader, stages=Stages(before_decisions=[stage]))

    result = await pipeline.execute(DEVELOPER, CallRequest(tool="echo", arguments_json='{"text": "hi"}'))
    assert result.error is not None and result.error.code is ErrorCode.APPROVAL_REQUIRED  # decided by the next set
    assert result.meta.policy_revision == reloader.revision != first.revision


class ReloadsDuringListing(DelegatingEngine):
    """The first policy set: while it decides a listing, the policies change and are reloaded."""

    reloader: ReloadingEngine

    async def decide_many(self, stage: Stage, inputs: InputBatch) -> Sequence[Decision]:
        if not hasattr(self, "reloaded"):
            self.reloaded = await self.reloader.reload_if_changed()
        return await self.inner.decide_many(stage, inputs)


async def test_a_listing_names_the_revision_its_decisions_came_from(make_pipeline: PipelineFactory,
                                                                    tmp_path: Path) -> None:
    policies = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    source = policy_source(PolicySettings(path=policies))
    first = ReloadsDuringListing(await source.load())
    reloader = first.reloader = ReloadingEngine(source, first, await source.fingerprint())
    rewrite(policies / "extra.rego", "package toolbooth.extra\n\nunused := true\n")  # another revision
    pipeline = await make_pipeline(policy=reloader)

    listing = await pipeline.list_tools(DEVELOPER)
    assert first.reloaded.revision != first.revision == listing.policy_revision
    assert (await pipeline.list_tools(DEVELOPER)).policy_revision == first.reloaded.revision
