"""The metric families and the parts that count into them, each alone (the whole sidecar: tests/integration)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from sidecar.errors import MalformedDecisionError, PolicyEvaluationError, StoreUnavailableError
from sidecar.metrics import UNKNOWN_TOOL, Metrics, go_code
from sidecar.policy import Decision, PolicyInput, Stage
from sidecar.policy.metered import MeteredEngine
from sidecar.state import AuditEvent, KeyScope
from sidecar.state.sqlite import SqliteStore

INPUT = PolicyInput.of({"principal": {"id": "p"}})


class Engine:
    """Answers every decision with ``answer``, or raises it."""

    def __init__(self, answer: Decision | Exception) -> None:
        self.answer = answer

    @property
    def revision(self) -> str:
        return "rev"

    @property
    def reads_idempotency_key(self) -> bool:
        return True

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        return [await self.decide(stage, one) for one in inputs]

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        return {}

    async def aclose(self) -> None:
        pass


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_grpc_codes_are_spelled_as_go_spells_them() -> None:
    assert [go_code(code) for code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED,
                                       grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED,
                                       grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.DATA_LOSS)] == [
        "OK", "Canceled", "InvalidArgument", "DeadlineExceeded", "Unauthenticated", "DataLoss"]


def test_each_sidecar_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()  # the same families twice: in the default registry, a duplicate error
    first.tool("echo").ended("success", "none", 0.001)
    assert sample(first, "toolbooth_tool_calls_total", tool="echo", status="success", code="none") == 1
    assert sample(second, "toolbooth_tool_calls_total", tool="echo", status="success", code="none") == 0


def test_histograms_are_exposed_cumulative_by_upper_bound() -> None:
    metrics = Metrics()
    for seconds in (0.00005, 0.0003, 0.0005, 2.0):
        metrics.decision("authz").seconds.observe(seconds)
    buckets = "toolbooth_policy_decision_seconds_bucket"
    assert [sample(metrics, buckets, stage="authz", le=le) for le in ("0.0001", "0.0005", "1.0", "+Inf")] == [
        1, 3, 3, 4]
    assert sample(metrics, "toolbooth_policy_decision_seconds_count", stage="authz") == 4
    assert sample(metrics, "toolbooth_policy_decision_seconds_sum", stage="authz") == pytest.approx(2.00085)


def test_meters_are_bound_once_per_label_set() -> None:
    metrics = Metrics()
    assert metrics.tool(UNKNOWN_TOOL) is metrics.tool(UNKNOWN_TOOL)
    assert metrics.rpc("/toolbooth.v1.ToolService/ExecuteTool") is metrics.rpc("/toolbooth.v1.ToolService/ExecuteTool")
    assert metrics.decision("authz") is metrics.decision("authz")


async def test_decisions_are_counted_by_answer_and_failures_as_errors() -> None:
    metrics = Metrics()
    await MeteredEngine(Engine(Decision(allow=True)), metrics).decide(Stage.AUTHZ, INPUT)
    await MeteredEngine(Engine(Decision(required=True)), metrics).decide(Stage.APPROVAL, INPUT)
    await MeteredEngine(Engine(Decision(allow=False)), metrics).decide_many(Stage.AVAILABILITY, [INPUT] * 3)
    for failure in (PolicyEvaluationError("down"), MalformedDecisionError("bad")):
        with pytest.raises(PolicyEvaluationError):
            await MeteredEngine(Engine(failure), metrics).decide(Stage.AUTHZ, INPUT)
    counted = "toolbooth_policy_decisions_total"
    assert sample(metrics, counted, stage="authz", allow="true") == 1
    assert sample(metrics, counted, stage="authz", allow="error") == 2
    assert sample(metrics, counted, stage="approval", allow="false") == 1  # an approval is required
    assert sample(metrics, counted, stage="availability", allow="false") == 3
    assert sample(metrics, "toolbooth_policy_decision_seconds_count", stage="availability") == 1  # one evaluation
    assert sample(metrics, "toolbooth_policy_decision_seconds_count", stage="authz") == 3


async def test_failed_store_statements_are_counted_by_name(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    metrics = Metrics()
    store.observe(metrics)
    try:
        await store.driver.execute("DROP TABLE previews")
        await store.driver.execute("DROP TABLE idempotency")
        with pytest.raises(StoreUnavailableError):
            await store.get_preview("p-1")
        with pytest.raises(StoreUnavailableError):
            await store.claim(KeyScope("acme", "p", "echo", "k"), "hash", "r-1")  # in a session
    finally:
        await store.aclose()
    errors = "toolbooth_store_errors_total"
    assert sample(metrics, errors, op="get_preview") == 1
    assert sample(metrics, errors, op="claim") == 1
    assert sample(metrics, errors, op="session") == 0  # the statement failed, not the session: counted once


async def test_the_audit_queue_depth_is_read_at_each_scrape(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    metrics = Metrics()
    store.observe(metrics)
    try:
        for n in range(3):
            store.queue_audit(AuditEvent(
                request_id=f"r{n}", time="t", principal_id="p", tenant="acme", tool="echo", tool_version="1",
                input_hash="h", decisions_json="{}", policy_revision="rev", idempotency_key=None, call_id=None,
                conversation_id=None, status="success", error_code=None, duration_ms=0, arguments_json=None))
        assert sample(metrics, "toolbooth_audit_queue_depth") == 3
        await store.flush_audit()
        assert sample(metrics, "toolbooth_audit_queue_depth") == 0
    finally:
        await store.aclose()
