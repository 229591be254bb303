"""The chain of stages: order, ending a call, refusals as results, closing its stages, and the one stage order
of bootstrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.bootstrap import assemble
from sidecar.config import Limits, bundled_policy_dir
from sidecar.contract import CallRequest, ErrorCode, ErrorInfo, Status, ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline import results
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Chain, Next
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.order import DecidingStages
from sidecar.pipeline.stages.approval import ApprovalStage
from sidecar.pipeline.stages.audit import AuditStage
from sidecar.pipeline.stages.authorize import AuthorizeStage
from sidecar.pipeline.stages.consume_approval import ConsumeApprovalStage
from sidecar.pipeline.stages.dispatch import DispatchStage
from sidecar.pipeline.stages.history import HistoryStage
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.request import RequestStage
from sidecar.pipeline.stages.resolve import ResolveStage
from sidecar.pipeline.stages.validate import ValidateStage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.conftest import DEVELOPER
from tests.support import tools


class Recorder:
    """Notes that it ran and what came back from the stages after it."""

    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    async def run(self, call: Call, next: Next) -> ToolResult:
        self.seen.append(f"{self.name} in")
        result = await next(call)
        self.seen.append(f"{self.name} out: {result.status}")
        return result


class Refuse:
    async def run(self, call: Call, next: Next) -> ToolResult:
        raise CallRefused(ErrorInfo.of(ErrorCode.PERMISSION_DENIED, "no"), ErrorInfo.of(ErrorCode.RATE_LIMITED, "x"))


class End:
    async def run(self, call: Call, next: Next) -> ToolResult:
        return results.result(call, Status.SUCCESS, data="done")


def _call() -> Call:
    return Call(DEVELOPER, CallRequest(tool="echo"), "rev-1")


async def test_stages_run_in_order_and_the_last_ends_the_call() -> None:
    seen: list[str] = []
    result = await Chain([Recorder("a", seen), Recorder("b", seen), End()])(_call())
    assert result.status is Status.SUCCESS and result.data == "done" and result.meta.policy_revision == "rev-1"
    assert seen == ["a in", "b in", "b out: success", "a out: success"]


async def test_a_refusal_ends_the_call_and_earlier_stages_see_it_as_a_result() -> None:
    seen: list[str] = []
    result = await Chain([Recorder("a", seen), Refuse(), Recorder("never", seen), End()])(_call())
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.code is ErrorCode.PERMISSION_DENIED and len(result.errors) == 2
    assert seen == ["a in", "a out: error"]


async def test_a_chain_whose_last_stage_passes_the_call_on_is_a_bug() -> None:
    with pytest.raises(AssertionError, match="last stage"):
        await Chain([Recorder("a", [])])(_call())


class Closing(Recorder):
    """A stage that notes when it is closed, failing to close with ``fails``."""

    def __init__(self, name: str, seen: list[str], fails: bool = False) -> None:
        super().__init__(name, seen)
        self.fails = fails

    async def aclose(self) -> None:
        self.seen.append(f"{self.name} closed")
        if self.fails:
            raise OSError(f"{self.name} could not close")


async def test_the_stages_with_an_aclose_are_closed_once_the_last_first_despite_a_failure() -> None:
    seen: list[str] = []
    first, failing, last = Closing("first", seen), Closing("failing", seen, fails=True), Closing("last", seen)
    chain = Chain([first, Recorder("not closing", seen), failing, last, first, End()])
    with pytest.raises(OSError, match="failing could not close"):
        await chain.aclose()
    assert seen == ["first closed", "last closed", "failing closed"]


async def test_a_real_call_meets_the_stages_in_the_designed_order(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    engine = EmbeddedEngine.load(bundled_policy_dir())
    pipeline = assemble(registry=Registry.from_tools(tools.ALL), policy=engine, store=store, limits=Limits())
    try:
        assert [type(stage) for stage in pipeline.chain.stages] == [
            AuditStage, RequestStage, ResolveStage, ValidateStage, HistoryStage, AuthorizeStage, ApprovalStage,
            IdempotencyStage, ConsumeApprovalStage, DispatchStage]
        deciding = DecidingStages.build(Registry.from_tools(tools.ALL), Decider(engine), Limits())
        assert [type(stage) for stage in deciding] == [ResolveStage, ValidateStage, HistoryStage, AuthorizeStage,
                                                       ApprovalStage]
    finally:
        await pipeline.aclose()
