"""Prometheus metrics of a real sidecar (``metrics.listen``), scraped over HTTP and parsed by prometheus_client.

One sidecar per test, built as ``toolbooth serve`` builds it (``open_sidecar``: the metered engine, store,
approvals and hot reload; ``create_server`` with the metrics interceptor; the MCP and metrics endpoints on
127.0.0.1:0), in dev mode, with the default policies and ``file_note`` needing approval.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.bootstrap import open_sidecar, serve
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Principal, Status, ToolResult
from sidecar.metrics import NO_CODE, UNKNOWN_TOOL
from sidecar.pipeline import Pipeline
from sidecar.policy.reload import ReloadingEngine
from sidecar.server import create_server
from sidecar.server.mcp_http import McpEndpoint
from sidecar.server.metrics_http import MetricsEndpoint
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.approvals import NOTE, policy_dir
from tests.support.mcp import http_session, typed
from tests.support.waiting import until

pytestmark = pytest.mark.integration

HOSTILE = 'evil"} 1\ntoolbooth_tool_calls_total{tool="x' + "y" * 300
APPROVER = Principal(id="boss", tenant="dev", roles=("approver",))
Labels = frozenset[tuple[str, str]]


@dataclass
class World:
    target: str
    metrics_url: str
    mcp_url: str
    pipeline: Pipeline
    reloader: ReloadingEngine
    policies: Path


async def scrape(url: str) -> dict[str, dict[Labels, float]]:
    """Every sample of the endpoint, by sample name, then by its labels."""
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: dict[str, dict[Labels, float]], name: str, **labels: str) -> float:
    return samples.get(name, {}).get(frozenset(labels.items()), 0.0)


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings]) -> AsyncIterator[World]:
    policies = policy_dir(tmp_path / "policies")
    settings = make_settings(metrics={"listen": "127.0.0.1:0"}, mcp={"listen": "127.0.0.1:0"},
                             policy={"path": str(policies)})
    registry = Registry.from_tools([*tools.ALL, tools.count_up])
    reloader, pipeline = await open_sidecar(settings, registry=registry)
    assert pipeline.metrics is not None
    endpoint = MetricsEndpoint(pipeline.metrics.registry, settings.metrics)
    mcp = McpEndpoint.open(settings, pipeline)
    _, sidecar = await create_server(settings, pipeline, policy=reloader, approvals=pipeline.approvals,
                                     metrics=pipeline.metrics)
    try:
        await endpoint.start()
        await mcp.start()
        await sidecar.start()
        yield World(sidecar.addresses[-1], endpoint.url, mcp.url, pipeline, reloader, policies)
    finally:
        await sidecar.stop(None)
        await mcp.stop()
        await endpoint.stop()
        await pipeline.aclose()


async def test_calls_of_every_kind_are_counted_with_bounded_labels(world: World) -> None:
    async with AsyncClient(world.target) as client:
        for _ in range(2):
            assert (await client.execute("echo", {"text": "hi"})).status is Status.SUCCESS
        invalid = await client.execute("echo", {"text": 5})
        denied = await client.execute("delete_records", {"text": "all"})
        hidden = await client.execute("admin_console", {"text": "x"})
        hostile = await client.execute(HOSTILE, {})
        unknown = await client.execute("no_such_tool", {})
        events = [event async for event in client.execute_stream("count_up", {"count": 2})]
        with pytest.raises(ClientError) as no_tool:
            await client.execute("", {})
    assert (invalid.error and invalid.error.code) is ErrorCode.INVALID_ARGUMENT
    assert (denied.error and denied.error.code) is ErrorCode.PERMISSION_DENIED
    for unavailable in (hidden, hostile, unknown):
        assert (unavailable.error and unavailable.error.code) is ErrorCode.TOOL_UNAVAILABLE
    assert isinstance(events[-1], ToolResult) and events[-1].status is Status.SUCCESS
    assert no_tool.value.code is grpc.StatusCode.INVALID_ARGUMENT
    async with http_session(world.mcp_url) as session:
        assert typed((await session.call_tool("echo", {"text": "mcp"})).structured_content).status is Status.SUCCESS

    samples = await scrape(world.metrics_url)
    calls = "toolbooth_tool_calls_total"
    assert value(samples, calls, tool="echo", status="success", code=NO_CODE) == 3  # two over gRPC, one over MCP
    assert value(samples, calls, tool="echo", status="error", code="INVALID_ARGUMENT") == 1
    assert value(samples, calls, tool="delete_records", status="error", code="PERMISSION_DENIED") == 1
    assert value(samples, calls, tool=UNKNOWN_TOOL, status="error", code="TOOL_UNAVAILABLE") == 3
    assert value(samples, calls, tool="count_up", status="success", code=NO_CODE) == 1
    assert value(samples, "toolbooth_tool_call_duration_seconds_count", tool="echo") == 4
    tools_seen = {dict(labels)["tool"] for labels in samples[calls]}
    assert tools_seen == {"echo", "delete_records", "count_up", UNKNOWN_TOOL}  # never a name from a request

    unary = {"grpc_type": "unary", "grpc_service": "toolbooth.v1.ToolService", "grpc_method": "ExecuteTool"}
    assert value(samples, "grpc_server_started_total", **unary) == 8
    assert value(samples, "grpc_server_handled_total", **unary, grpc_code="OK") == 7
    assert value(samples, "grpc_server_handled_total", **unary, grpc_code="InvalidArgument") == 1
    assert value(samples, "grpc_server_handling_seconds_count", **unary) == 8
    stream = {**unary, "grpc_type": "server_stream", "grpc_method": "ExecuteToolStream"}
    assert value(samples, "grpc_server_handled_total", **stream, grpc_code="OK") == 1

    decisions = "toolbooth_policy_decisions_total"
    # hidden, and the well-formed unknown name (decided on a stand-in); the hostile name is refused undecided
    assert value(samples, decisions, stage="availability", allow="false") == 2
    assert value(samples, decisions, stage="authz", allow="false") == 1
    assert value(samples, decisions, stage="authz", allow="true") == 4  # echo x3 (the invalid one never gets here)
    assert value(samples, "toolbooth_policy_decision_seconds_count", stage="availability") >= 8
    assert value(samples, "toolbooth_audit_queue_depth") >= 0


async def test_approvals_reloads_and_the_audit_queue_are_counted(world: World) -> None:
    async with AsyncClient(world.target) as client:
        held = await client.execute("file_note", NOTE, idempotency_key="k-1")
    assert held.status is Status.APPROVAL_REQUIRED and held.preview is not None
    approvals = world.pipeline.approvals
    assert (await approvals.approve(APPROVER, held.preview.preview_id, held.preview.preview_hash, "ok")).ok
    assert not (await approvals.deny(APPROVER, held.preview.preview_id, "too late")).ok  # already approved

    (world.policies / "broken.rego").write_text("package toolbooth.broken\nthis is not rego\n")
    await world.reloader.reload_if_changed()
    (world.policies / "broken.rego").unlink()
    data = json.loads((world.policies / "data.json").read_text())
    (world.policies / "data.json").write_text(json.dumps({**data, "extra": 1}))
    await world.reloader.reload_if_changed()

    samples = await scrape(world.metrics_url)
    assert value(samples, "toolbooth_tool_calls_total", tool="file_note", status="approval_required",
                 code="APPROVAL_REQUIRED") == 1
    assert value(samples, "toolbooth_approvals_total", decision="approved") == 1
    assert value(samples, "toolbooth_approvals_total", decision="refused") == 1
    assert value(samples, "toolbooth_policy_decisions_total", stage="approval", allow="false") == 1
    assert value(samples, "toolbooth_policy_decisions_total", stage="approver", allow="true") == 2
    assert value(samples, "toolbooth_policy_reloads_total", result="refused") == 1
    assert value(samples, "toolbooth_policy_reloads_total", result="loaded") == 1
    await world.pipeline.store.flush_audit()
    assert value(await scrape(world.metrics_url), "toolbooth_audit_queue_depth") == 0


async def test_two_sidecars_in_one_process_count_apart(world: World, tmp_path: Path,
                                                       make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(metrics={"listen": "127.0.0.1:0"}, store={"sqlite_path": str(tmp_path / "two.db")})
    _, other = await open_sidecar(settings, registry=Registry.from_tools(tools.ALL))
    try:
        assert other.metrics is not None and world.pipeline.metrics is not None
        assert other.metrics.registry is not world.pipeline.metrics.registry
    finally:
        await other.aclose()
    async with AsyncClient(world.target) as client:
        await client.execute("echo", {"text": "hi"})
    assert value(await scrape(world.metrics_url), "toolbooth_tool_calls_total", tool="echo", status="success",
                 code=NO_CODE) == 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_serve_answers_scrapes_until_it_stops(make_settings: Callable[..., Settings],
                                                    socket_path: Path) -> None:
    port, stop = _free_port(), asyncio.Event()
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]}, metrics={"listen": f"127.0.0.1:{port}"})
    serving = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop))
    url = f"http://127.0.0.1:{port}/metrics"

    async def answers() -> bool:
        if serving.done():
            serving.result()  # start-up failed: raise its error
        try:
            await scrape(url)
        except aiohttp.ClientConnectionError:
            return False
        return socket_path.exists()

    try:
        await until(answers, what="the sidecar and its metrics endpoint answer")
        async with AsyncClient(f"unix://{socket_path}") as client:
            await client.execute("echo", {"text": "hi"})
        samples = await scrape(url)
    finally:
        stop.set()
        await serving
    assert value(samples, "toolbooth_tool_calls_total", tool="echo", status="success", code=NO_CODE) == 1
    assert "process_cpu_seconds_total" not in samples  # the sidecar's own registry, not the process-wide one
    with pytest.raises(aiohttp.ClientConnectionError):  # stopped with the sidecar: the port is closed
        await scrape(url)


async def test_a_taken_metrics_port_stops_start_up_with_the_reason(make_settings: Callable[..., Settings]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = make_settings(metrics={"listen": f"127.0.0.1:{port}"})
        with pytest.raises(OSError, match=rf"cannot listen on metrics.listen 127.0.0.1:{port}: the port is in use"):
            await serve(settings, registry=Registry.from_tools(tools.ALL))
