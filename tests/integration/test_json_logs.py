"""JSON log lines of a real sidecar (in-process, the root logger's records through ``json_formatter``): every line
written during a call carries its request id, tool, caller and trace id; one access line per RPC, unary and
streaming, with its method, gRPC code and duration; a bad ``logging.format`` is a clear error."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import structlog
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.cli import main
from sidecar.config import Settings
from sidecar.server import interceptors
from sidecar.server.auth import Authenticator
from sidecar.server.interceptors import AccessLogInterceptor
from sidecar.telemetry.logs import json_formatter, setup_json_logging
from sidecar.telemetry.tracing import Tracing
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.services import serving

pytestmark = pytest.mark.integration

Lines = Callable[[], list[dict[str, Any]]]
EXECUTE = "/toolbooth.v1.ToolService/ExecuteTool"


@pytest.fixture
def json_lines() -> Iterator[Lines]:
    """The root logger at INFO, its records also written as JSON lines; ``json_lines()`` parses them so far."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _json_settings(make_settings: Callable[..., Settings], **sections: dict[str, Any]) -> Settings:
    return make_settings(logging={"format": "json", "access": True}, **sections)


def _access(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(line["method"].rsplit("/", 1)[1], line["grpc_code"]) for line in lines
            if line["logger"] == "toolbooth.access"]


async def test_a_line_written_during_a_call_carries_the_calls_fields(
        make_settings: Callable[..., Settings], json_lines: Lines) -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting(SimpleSpanProcessor(exporter))
    async with serving(_json_settings(make_settings), Registry.from_tools(tools.ALL), tracing=tracing) as services:
        reply = await services.tools.ExecuteTool(pb.ExecuteToolRequest(tool="boom", arguments_json='{"text": "x"}'))
    assert reply.status == pb.STATUS_ERROR
    [line] = [line for line in json_lines() if line["logger"] == "toolbooth.tool.boom"]
    [span] = [span for span in exporter.get_finished_spans() if span.name == "execute_tool boom"]
    assert line["level"] == "error"
    assert line["event"] == "handler of tool 'boom' raised RuntimeError"
    assert line["request_id"] == reply.meta.request_id
    assert line["tool"] == "boom" and line["principal"] == "dev"
    assert line["trace_id"] == format(span.context.trace_id, "032x")
    assert "Traceback" in line["exception"]
    assert line["timestamp"].endswith("Z")


async def test_without_tracing_lines_have_the_call_fields_but_no_trace(
        make_settings: Callable[..., Settings], json_lines: Lines) -> None:
    async with serving(_json_settings(make_settings), Registry.from_tools(tools.ALL), tracing=Tracing()) as services:
        reply = await services.tools.ExecuteTool(pb.ExecuteToolRequest(tool="boom", arguments_json='{"text": "x"}'))
    [line] = [line for line in json_lines() if line["logger"] == "toolbooth.tool.boom"]
    assert line["request_id"] == reply.meta.request_id and line["tool"] == "boom"
    assert "trace_id" not in line


async def test_one_access_line_per_rpc_unary_and_streaming(
        make_settings: Callable[..., Settings], json_lines: Lines) -> None:
    async with serving(_json_settings(make_settings), Registry.from_tools(tools.ALL), tracing=Tracing()) as services:
        await services.tools.ExecuteTool(pb.ExecuteToolRequest(tool="echo", arguments_json='{"text": "x"}'))
        await services.tools.ListTools(pb.ListToolsRequest())
        [_ async for _ in services.tools.ExecuteToolStream(pb.ExecuteToolRequest(tool="echo",
                                                                                 arguments_json='{"text": "x"}'))]
        with pytest.raises(grpc.aio.AioRpcError):
            await services.tools.ExecuteTool(pb.ExecuteToolRequest())
    lines = json_lines()
    assert _access(lines) == [("ExecuteTool", "OK"), ("ListTools", "OK"), ("ExecuteToolStream", "OK"),
                              ("ExecuteTool", "INVALID_ARGUMENT")]
    access = [line for line in lines if line["logger"] == "toolbooth.access"]
    assert all(line["level"] == "info" and isinstance(line["duration_ms"], float) for line in access)
    assert access[0]["event"].startswith(f"{EXECUTE} OK ") and access[0]["event"].endswith(" ms")


async def test_the_access_line_has_the_code_authentication_chose(
        make_settings: Callable[..., Settings], jwt_auth: dict[str, Any], json_lines: Lines) -> None:
    settings = _json_settings(make_settings, auth=jwt_auth)
    async with serving(settings, Registry.from_tools(tools.ALL), tracing=Tracing()) as services:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await services.tools.ExecuteTool(pb.ExecuteToolRequest(tool="echo"))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert _access(json_lines()) == [("ExecuteTool", "UNAUTHENTICATED")]


async def test_access_false_leaves_the_access_line_out(make_settings: Callable[..., Settings],
                                                       json_lines: Lines) -> None:
    settings = make_settings(logging={"format": "json", "access": False})
    async with serving(settings, Registry.from_tools(tools.ALL), tracing=Tracing()) as services:
        await services.tools.ExecuteTool(pb.ExecuteToolRequest(tool="echo", arguments_json='{"text": "x"}'))
    assert _access(json_lines()) == []


def test_no_access_interceptor_when_its_lines_would_be_dropped(make_settings: Callable[..., Settings]) -> None:
    authenticator = Authenticator(make_settings().auth)
    access = logging.getLogger("toolbooth.access")
    level = access.level
    try:
        access.setLevel(logging.WARNING)
        assert not AccessLogInterceptor.wanted()
        assert not [i for i in interceptors.chain(authenticator, access_log=True)
                    if isinstance(i, AccessLogInterceptor)]
        access.setLevel(logging.INFO)
        assert isinstance(interceptors.chain(authenticator, access_log=True)[0], AccessLogInterceptor)
        assert not [i for i in interceptors.chain(authenticator) if isinstance(i, AccessLogInterceptor)]  # default
    finally:
        access.setLevel(level)


def test_json_setup_makes_every_logger_write_json(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_json_logging("INFO")
        logging.getLogger("some.library").warning("disk %s full", "/var", extra={"device": "sda"})
        logging.getLogger("some.library").debug("below the level")
        structlog.get_logger("a.plugin").info("tool ready", version=2)
        sys.stderr.flush()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["logger"], line["level"], line["event"]) for line in lines] == [
        ("some.library", "warning", "disk /var full"), ("a.plugin", "info", "tool ready")]
    assert lines[0]["device"] == "sda" and lines[1]["version"] == 2


def test_a_bad_format_is_a_config_error(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text("logging:\n  format: logfmt\n")
    assert main(["config", "validate", "--config", str(config)]) == 2
    assert "config error at logging.format: Input should be 'text' or 'json'" in capsys.readouterr().err
