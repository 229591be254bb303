"""A real ``toolbooth serve`` process with metrics, console traces (``OTEL_TRACES_EXPORTER=console``) and JSON logs
on: its metrics scraped over HTTP, its spans on stdout, every stderr line a JSON object (the start-up lines listing
what it serves with, one access line per RPC), the spans flushed at shutdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from tests.integration.test_metrics import _free_port, scrape, value
from tests.support.sidecar_process import SidecarProcess

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SECRET = "an-argument-value"


def _objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects ``text`` holds one after another (the console exporter's are indented)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := _skip_space(text, at)) < len(text):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


async def test_metrics_console_traces_and_json_logs_of_a_serving_process(tmp_path: Path) -> None:
    config, port = tmp_path / "toolbooth.json", _free_port()
    config.write_text(json.dumps({"server": {"listen": [f"unix://{tmp_path / 's.sock'}"]},
                                  "metrics": {"listen": f"127.0.0.1:{port}"},
                                  "store": {"sqlite_path": str(tmp_path / "s.db")},
                                  "logging": {"format": "json", "access": True}, "log_level": "INFO"}))
    sidecar = SidecarProcess(config, tmp_path / "s.sock", tmp_path / "s.err", tmp_path / "appended.log",
                             stdout=tmp_path / "s.out",
                             env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "toolbooth-test"})
    try:
        await sidecar.wait_serving()
        async with grpc.aio.insecure_channel(sidecar.target) as channel:
            stub = pb_grpc.ToolServiceStub(channel)
            reply = await stub.ExecuteTool(pb.ExecuteToolRequest(
                tool="append_line", arguments_json=json.dumps({"text": SECRET}), idempotency_key="k-1",
                call_id="call-1"), metadata=(("traceparent", TRACEPARENT),), timeout=10)
            assert reply.status == pb.STATUS_SUCCESS, reply
            hidden = await stub.ExecuteTool(pb.ExecuteToolRequest(tool="no_such_tool", arguments_json="{}"), timeout=10)
            assert hidden.error.code == pb.ERROR_CODE_TOOL_UNAVAILABLE, hidden
        samples = await scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        assert sidecar.stop() == 0, sidecar.output()
    spans = _objects((tmp_path / "s.out").read_text())
    lines = [json.loads(line) for line in sidecar.output().splitlines()]

    [root] = [span for span in spans if span["name"] == "execute_tool append_line"]
    assert root["context"]["trace_id"] == f"0x{TRACE_ID}" and root["parent_id"] == "0x00f067aa0ba902b7"
    assert root["resource"]["attributes"]["service.name"] == "toolbooth-test"
    assert root["attributes"]["gen_ai.tool.call.id"] == "call-1"
    assert root["attributes"]["toolbooth.request_id"] == reply.meta.request_id
    children = {span["name"] for span in spans if span["parent_id"] == root["context"]["span_id"]}
    assert {"policy", "store claim", "handler append_line", "store complete"} <= children
    assert SECRET not in (tmp_path / "s.out").read_text()

    started = {key: line[key] for line in lines for key in ("plugins", "tools", "store", "policy_engine",
                                                             "policy_revision", "listeners", "trace_exporters")
               if key in line}
    assert "append_line" in started["tools"] and started["listeners"] == [sidecar.target]
    assert started["policy_engine"] == "embedded" and started["policy_revision"].startswith("sha256:")
    assert started["trace_exporters"] == ["console"] and started["store"].startswith("sqlite")
    access = [line for line in lines if line["logger"] == "toolbooth.access"]
    assert [(line["method"], line["grpc_code"]) for line in access] == [
        ("/toolbooth.v1.ToolService/ExecuteTool", "OK")] * 2  # a refused call is a result, not a gRPC error
    assert all(line["duration_ms"] > 0 and line["level"] == "info" for line in access)
    assert SECRET not in sidecar.output()

    calls = "toolbooth_tool_calls_total"
    assert value(samples, calls, tool="append_line", status="success", code="none") == 1
    assert value(samples, calls, tool="_unknown", status="error", code="TOOL_UNAVAILABLE") == 1
    assert value(samples, "toolbooth_tool_call_duration_seconds_count", tool="append_line") == 1
    assert value(samples, "grpc_server_handled_total", grpc_service="toolbooth.v1.ToolService",
                 grpc_method="ExecuteTool", grpc_type="unary", grpc_code="OK") == 2
    assert value(samples, "toolbooth_policy_decisions_total", stage="authz", allow="true") == 1
