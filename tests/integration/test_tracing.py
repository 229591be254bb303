"""Traces of a real sidecar (in-process, its spans in memory through the composition root): one span per call
named ``execute_tool {tool}`` with the GenAI attributes, children for the policy decisions, the store and the
handler, the caller's ``traceparent`` continued, no argument value anywhere; none at all when tracing is off,
or when the sampler leaves the call out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.bootstrap import open_pipeline
from sidecar.config import Settings
from sidecar.errors import ConfigError
from sidecar.pipeline.stages.trace import TraceStage
from sidecar.server.mcp_http import McpEndpoint
from sidecar.telemetry.tracing import Tracing
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.mcp import http_client
from tests.support.services import Services, serving

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SECRET = "argument-value-never-on-a-span"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced(make_settings: Callable[..., Settings], exporter: InMemorySpanExporter) -> AsyncIterator[Services]:
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))
    async with serving(make_settings(), Registry.from_tools(tools.ALL), tracing=tracing) as services:
        yield services


def _request(tool: str, **fields: Any) -> pb.ExecuteToolRequest:
    return pb.ExecuteToolRequest(tool=tool, arguments_json=json.dumps({"text": SECRET}), **fields)


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def _children(spans: tuple[ReadableSpan, ...], parent: ReadableSpan) -> list[str]:
    """The names of ``parent``'s children, in the order they started."""
    children = [span for span in spans if span.parent is not None and span.parent.span_id == parent.context.span_id]
    return [span.name for span in sorted(children, key=lambda span: span.start_time or 0)]


async def test_a_call_is_one_execute_tool_span_continuing_the_callers_trace(
        traced: Services, exporter: InMemorySpanExporter) -> None:
    reply = await traced.tools.ExecuteTool(_request("echo", call_id="call-7"), metadata=(("traceparent", TRACEPARENT),))
    assert reply.status == pb.STATUS_SUCCESS
    spans = exporter.get_finished_spans()
    [root] = _named(spans, "execute_tool echo")
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT_ID and root.parent.is_remote
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "echo"
    assert attributes["gen_ai.tool.call.id"] == "call-7"
    assert attributes["gen_ai.tool.type"] == "extension"
    assert attributes["toolbooth.status"] == "success"
    assert attributes["toolbooth.principal.id"] == "dev"
    assert attributes["toolbooth.request_id"] == reply.meta.request_id
    assert str(attributes["toolbooth.policy.revision"]).startswith("sha256:")
    assert "error.type" not in attributes and root.status.status_code is StatusCode.UNSET
    assert _children(spans, root) == ["policy", "handler echo"]
    assert {format(span.context.trace_id, "032x") for span in spans} == {TRACE_ID}


async def test_a_write_has_spans_of_its_store_operations(traced: Services, exporter: InMemorySpanExporter) -> None:
    reply = await traced.tools.ExecuteTool(_request("create_note", idempotency_key="k-1"))
    assert reply.status == pb.STATUS_SUCCESS
    spans = exporter.get_finished_spans()
    [root] = _named(spans, "execute_tool create_note")
    assert root.parent is None  # no traceparent: a new trace
    assert _children(spans, root) == ["policy", "store claim", "store record_audit", "handler create_note",
                                      "store complete"]


async def test_no_argument_value_reaches_a_span(traced: Services, exporter: InMemorySpanExporter) -> None:
    await traced.tools.ExecuteTool(_request("echo"))
    await traced.tools.ExecuteTool(_request("create_note", idempotency_key="k-2"))
    await traced.tools.ExecuteTool(_request("boom"))
    exported = [span.to_json() for span in exporter.get_finished_spans()]
    assert len(exported) > 10
    assert not [text for text in exported if SECRET in text]


async def test_a_failed_call_says_its_error_code(traced: Services, exporter: InMemorySpanExporter) -> None:
    denied = await traced.tools.ExecuteTool(_request("admin_console"))
    failed = await traced.tools.ExecuteTool(_request("boom"))
    assert denied.status == failed.status == pb.STATUS_ERROR
    assert pb.ERROR_CODE_UNSPECIFIED not in (denied.error.code, failed.error.code)
    spans = exporter.get_finished_spans()
    for name, code in (("execute_tool admin_console", denied.error.code), ("execute_tool boom", failed.error.code)):
        [span] = _named(spans, name)
        attributes = dict(span.attributes or {})
        assert attributes["toolbooth.status"] == "error"
        assert attributes["error.type"] == pb.ErrorCode.Name(code).removeprefix("ERROR_CODE_")
        assert span.status.status_code is StatusCode.ERROR
    [admin] = _named(spans, "execute_tool admin_console")
    assert "handler admin_console" not in _children(spans, admin)  # refused before it ran


async def test_batch_and_stream_calls_are_traced_by_the_same_stage(
        traced: Services, exporter: InMemorySpanExporter) -> None:
    batch = pb.ExecuteToolBatchRequest(calls=[_request("echo", call_id="a"), _request("echo_sync", call_id="b")])
    await traced.tools.ExecuteToolBatch(batch, metadata=(("traceparent", TRACEPARENT),))
    events = [event async for event in traced.tools.ExecuteToolStream(
        _request("echo", call_id="c"), metadata=(("traceparent", TRACEPARENT),))]
    assert events
    roots = [span for span in exporter.get_finished_spans() if span.name.startswith("execute_tool ")]
    assert sorted((span.name, dict(span.attributes or {})["gen_ai.tool.call.id"]) for span in roots) == [
        ("execute_tool echo", "a"), ("execute_tool echo", "c"), ("execute_tool echo_sync", "b")]
    assert all(span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID for span in roots)


async def test_two_sidecars_trace_apart(make_settings: Callable[..., Settings], tmp_path: Any) -> None:
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    settings = make_settings()
    other = make_settings(server={"listen": [f"unix://{tmp_path}/other.sock", "127.0.0.1:0"]},
                          store={"sqlite_path": str(tmp_path / "other.db")})
    registry = Registry.from_tools(tools.ALL)
    async with serving(settings, registry, tracing=Tracing.exporting(SimpleSpanProcessor(first))) as one, \
            serving(other, registry, tracing=Tracing.exporting(SimpleSpanProcessor(second))) as two:
        await one.tools.ExecuteTool(_request("echo"))
        await two.tools.ExecuteTool(_request("echo_sync"))
    assert [span.name for span in first.get_finished_spans() if span.parent is None] == ["execute_tool echo"]
    assert [span.name for span in second.get_finished_spans() if span.parent is None] == ["execute_tool echo_sync"]


async def test_off_no_trace_stage_and_no_spans(make_settings: Callable[..., Settings],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    async with serving(make_settings(), Registry.from_tools(tools.ALL)) as services:
        assert not services.pipeline.tracing.enabled
        assert not [stage for stage in services.pipeline.chain.stages if isinstance(stage, TraceStage)]
        reply = await services.tools.ExecuteTool(_request("echo"), metadata=(("traceparent", TRACEPARENT),))
        assert reply.status == pb.STATUS_SUCCESS


@pytest.mark.parametrize("value", ["", "none", "None", " none "])
def test_no_exporter_means_no_tracing(value: str) -> None:
    assert not Tracing.from_env({"OTEL_TRACES_EXPORTER": value}).enabled
    assert not Tracing.from_env({}).enabled


async def test_the_console_exporter_with_the_sdks_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agent-sidecar")
    tracing = Tracing.from_env({"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert tracing.enabled and tracing.exporters == ("console",)
        assert tracing.provider is not None
        assert tracing.provider.resource.attributes["service.name"] == "agent-sidecar"
    finally:
        await tracing.aclose()
    assert not Tracing.from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}).enabled


async def test_the_service_is_toolbooth_unless_the_environment_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    tracing = Tracing.from_env({"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert tracing.provider is not None and tracing.provider.resource.attributes["service.name"] == "toolbooth"
    finally:
        await tracing.aclose()


def test_an_exporter_that_is_not_installed_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"OTEL_TRACES_EXPORTER='zipkin_json': no such span exporter is installed; "
                                          r"installed: .*console.*none"):
        Tracing.from_env({"OTEL_TRACES_EXPORTER": "zipkin_json"})


@pytest.mark.parametrize("protocol", [{}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
                                      {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}])
async def test_otlp_is_the_exporter_of_its_protocol(protocol: dict[str, str]) -> None:
    """No exporter registers ``otlp`` itself: it is found as ``otlp_proto_grpc`` (the extra's), the SDK's way
    (the exporters' export reaching a collector: tests/integration/test_benchmarks_run.py)."""
    tracing = Tracing.from_env({"OTEL_TRACES_EXPORTER": "otlp", **protocol})
    try:
        assert tracing.enabled and tracing.exporters == ("otlp",)
    finally:
        await tracing.aclose()


def test_otlp_over_a_protocol_whose_exporter_is_not_installed_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"OTEL_TRACES_EXPORTER='otlp': no such span exporter is installed "
                                          r"\(for it: otlp_proto_http\) "
                                          r"\(toolbooth\[otlp\] installs otlp_proto_grpc\)"):
        Tracing.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_an_unknown_otlp_protocol_is_a_clear_error(variable: str) -> None:
    with pytest.raises(ConfigError, match=f"{variable}='http/json': not an OTLP protocol of traces; expected one of "
                                          "grpc, http/protobuf"):
        Tracing.from_env({"OTEL_TRACES_EXPORTER": "otlp", variable: "http/json"})


async def test_an_unauthenticated_call_makes_no_span(make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                                                     exporter: InMemorySpanExporter) -> None:
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))
    async with serving(make_settings(auth=jwt_auth), Registry.from_tools(tools.ALL), tracing=tracing) as services:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await services.tools.ExecuteTool(_request("echo"), metadata=(("traceparent", TRACEPARENT),))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert exporter.get_finished_spans() == ()


async def test_the_sampler_of_the_environment_decides(make_settings: Callable[..., Settings],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))
    async with serving(make_settings(), Registry.from_tools(tools.ALL), tracing=tracing) as services:
        reply = await services.tools.ExecuteTool(_request("create_note", idempotency_key="k-3"))
    assert reply.status == pb.STATUS_SUCCESS
    assert exporter.get_finished_spans() == ()


async def test_an_mcp_call_continues_the_trace_of_its_http_request(make_settings: Callable[..., Settings],
                                                                   exporter: InMemorySpanExporter) -> None:
    settings = make_settings(mcp={"listen": "127.0.0.1:0"})
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))
    pipeline = await open_pipeline(settings, registry=Registry.from_tools(tools.ALL), tracing=tracing)
    endpoint = McpEndpoint.open(settings, pipeline)
    try:
        await endpoint.start()
        async with http_client(headers={"traceparent": TRACEPARENT}) as http, \
                streamable_http_client(endpoint.url, http_client=http) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            answer = await session.call_tool("echo", {"text": SECRET}, meta={"toolbooth/call_id": "mcp-1"})
        assert not answer.is_error
    finally:
        await endpoint.stop()
        await pipeline.aclose()
    [root] = _named(exporter.get_finished_spans(), "execute_tool echo")
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT_ID
    assert dict(root.attributes or {})["gen_ai.tool.call.id"] == "mcp-1"
    assert not [span for span in exporter.get_finished_spans() if SECRET in span.to_json()]


async def test_the_policy_decisions_of_a_call_are_one_span(traced: Services, exporter: InMemorySpanExporter) -> None:
    reply = await traced.tools.ExecuteTool(_request("echo"))
    assert reply.status == pb.STATUS_SUCCESS
    spans = exporter.get_finished_spans()
    [root], [policy], [handler] = (_named(spans, name) for name in ("execute_tool echo", "policy", "handler echo"))
    assert policy.parent is not None and policy.parent.span_id == root.context.span_id
    assert dict(policy.attributes or {}) == {
        "toolbooth.policy.stages": ("availability", "authz", "approval"),
        "toolbooth.policy.availability.allow": True, "toolbooth.policy.authz.allow": True,
        "toolbooth.policy.approval.required": False}
    assert policy.status.status_code is StatusCode.UNSET
    assert root.start_time is not None and policy.start_time is not None and handler.start_time is not None
    assert root.end_time is not None and policy.end_time is not None
    assert root.start_time <= policy.start_time <= policy.end_time <= handler.start_time <= root.end_time


async def test_a_denied_call_has_the_decisions_up_to_its_denial(traced: Services,
                                                                exporter: InMemorySpanExporter) -> None:
    denied = await traced.tools.ExecuteTool(_request("delete_records"))
    assert denied.error.code == pb.ERROR_CODE_PERMISSION_DENIED, denied
    [policy] = _named(exporter.get_finished_spans(), "policy")
    assert dict(policy.attributes or {}) == {"toolbooth.policy.stages": ("availability", "authz"),
                                             "toolbooth.policy.availability.allow": True,
                                             "toolbooth.policy.authz.allow": False}


async def test_a_call_under_an_unsampled_traceparent_makes_no_span(
        make_settings: Callable[..., Settings], exporter: InMemorySpanExporter) -> None:
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))  # parentbased_always_on: the parent decides
    async with serving(make_settings(), Registry.from_tools(tools.ALL), tracing=tracing) as services:
        unsampled = await services.tools.ExecuteTool(_request("create_note", idempotency_key="k-4"),
                                                     metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00"),))
        assert unsampled.status == pb.STATUS_SUCCESS
        assert exporter.get_finished_spans() == ()
        sampled = await services.tools.ExecuteTool(_request("echo"), metadata=(("traceparent", TRACEPARENT),))
        assert sampled.status == pb.STATUS_SUCCESS
    [root] = [span for span in exporter.get_finished_spans() if span.name.startswith("execute_tool ")]
    assert root.name == "execute_tool echo" and format(root.context.trace_id, "032x") == TRACE_ID


async def test_a_ratio_sampler_that_drops_new_traces_still_continues_sampled_ones(
        make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch,
        exporter: InMemorySpanExporter) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))
    async with serving(make_settings(), Registry.from_tools(tools.ALL), tracing=tracing) as services:
        for _ in range(5):
            assert (await services.tools.ExecuteTool(_request("echo_sync"))).status == pb.STATUS_SUCCESS
        reply = await services.tools.ExecuteTool(_request("echo"), metadata=(("traceparent", TRACEPARENT),))
        assert reply.status == pb.STATUS_SUCCESS
    spans = exporter.get_finished_spans()
    assert sorted(span.name for span in spans) == ["execute_tool echo", "handler echo", "policy"]
    assert {format(span.context.trace_id, "032x") for span in spans} == {TRACE_ID}
