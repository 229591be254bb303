"""The spans of a call's parts (``sidecar.telemetry.spans``): the policy decisions noted for one ``policy``
span, made when the call closes, from the first decision's start to the last one's end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from time import time_ns

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sidecar.bootstrap import assemble
from sidecar.config import Limits
from sidecar.contract import CallRequest, ErrorCode
from sidecar.policy import Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.state.sqlite import SqliteStore
from sidecar.telemetry.spans import POLICY_SPAN, CallTrace
from sidecar.telemetry.tracing import Tracing
from sidecar.tools.registry import Registry
from tests.conftest import DEVELOPER
from tests.support import tools
from tests.unit.test_pipeline import FailingEngine


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    return Tracing.exporting(SimpleSpanProcessor(exporter))


def _policy_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = [span for span in exporter.get_finished_spans() if span.name == POLICY_SPAN]
    return span


def test_decisions_share_one_span_from_the_first_start_to_the_last_end(
        tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    assert tracing.tracer is not None
    root = tracing.tracer.start_span("execute_tool x")
    trace = CallTrace(tracing.tracer, root)
    before = time_ns()
    with trace.deciding("availability") as outcome:
        outcome.set("allow", True)
    assert exporter.get_finished_spans() == ()  # made when the call closes, not per decision
    with trace.deciding("authz") as outcome:
        outcome.set("allow", False)
    after = time_ns()
    trace.close()
    trace.close()  # once only
    root.end()
    span = _policy_span(exporter)
    assert span.parent is not None and span.parent.span_id == root.get_span_context().span_id
    assert dict(span.attributes or {}) == {"toolbooth.policy.stages": ("availability", "authz"),
                                           "toolbooth.policy.availability.allow": True,
                                           "toolbooth.policy.authz.allow": False}
    assert span.start_time is not None and span.end_time is not None
    assert before <= span.start_time <= span.end_time <= after
    assert span.status.status_code is StatusCode.UNSET


def test_no_decision_no_policy_span(tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    assert tracing.tracer is not None
    root = tracing.tracer.start_span("execute_tool x")
    CallTrace(tracing.tracer, root).close()
    root.end()
    assert [span.name for span in exporter.get_finished_spans()] == ["execute_tool x"]


def test_an_exception_ending_a_decision_fails_the_span(tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    assert tracing.tracer is not None
    trace = CallTrace(tracing.tracer, tracing.tracer.start_span("execute_tool x"))
    with trace.deciding("availability") as outcome:
        outcome.set("allow", True)
    with pytest.raises(asyncio.CancelledError), trace.deciding("authz"):
        raise asyncio.CancelledError
    trace.close()
    span = _policy_span(exporter)
    assert dict(span.attributes or {})["error.type"] == "CancelledError"
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "CancelledError"


async def test_an_engine_failure_is_the_policy_spans_error(tmp_path: Path, default_engine: EmbeddedEngine,
                                                           tracing: Tracing, exporter: InMemorySpanExporter) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    pipeline = assemble(registry=Registry.from_tools(tools.ALL), policy=FailingEngine(default_engine, Stage.AUTHZ),
                        store=store, limits=Limits(), tracing=tracing)
    try:
        result = await pipeline.execute(DEVELOPER, CallRequest(tool="echo", arguments_json=json.dumps({"text": "x"})))
    finally:
        await pipeline.aclose()
    assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE
    span = _policy_span(exporter)
    assert dict(span.attributes or {}) == {"toolbooth.policy.stages": ("availability", "authz"),
                                           "toolbooth.policy.availability.allow": True,
                                           "toolbooth.policy.authz.error": "SERVICE_UNAVAILABLE",
                                           "error.type": "SERVICE_UNAVAILABLE"}
    assert span.status.status_code is StatusCode.ERROR
