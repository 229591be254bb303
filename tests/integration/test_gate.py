"""Every outcome of the gate, through a real server on a Unix socket.

Each scenario runs twice: through the generated stub (raw protobuf, as any
language would call it) and through the typed Python client.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings, bundled_policy_dir
from sidecar.tools.registry import Registry
from tests.support import tools

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Outcome:
    """A result reduced to what the tests compare, whichever way it was obtained."""

    status: str
    code: str | None
    field: str | None
    message: str | None
    data: Any
    replayed: bool
    attempt: int


Call = Callable[..., Awaitable[Outcome]]


def from_pb(result: pb.ToolResult) -> Outcome:
    error = result.error if result.HasField("error") else None
    return Outcome(
        status=pb.Status.Name(result.status).removeprefix("STATUS_").lower(),
        code=pb.ErrorCode.Name(error.code).removeprefix("ERROR_CODE_") if error else None,
        field=(error.field or None) if error else None,
        message=error.message if error else None,
        data=json.loads(result.data_json) if result.data_json else None,
        replayed=result.meta.idempotency_replayed,
        attempt=result.meta.attempt,
    )


async def via_stub(address: str, tool: str, arguments: Any = None, **fields: Any) -> Outcome:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ToolServiceStub(channel)
        return from_pb(await stub.ExecuteTool(pb.ExecuteToolRequest(tool=tool, arguments_json=text, **fields),
                                              timeout=10))


async def via_client(address: str, tool: str, arguments: Any = None, **fields: Any) -> Outcome:
    async with AsyncClient(address, timeout=10) as client:
        result = await client.execute(tool, arguments if arguments is not None else {}, **fields)
    error = result.error
    return Outcome(status=result.status.value, code=error.code.value if error else None,
                   field=error.field if error else None, message=error.message if error else None,
                   data=result.data, replayed=result.meta.idempotency_replayed, attempt=result.meta.attempt)


@pytest.fixture(params=["stub", "client"])
def via(request: pytest.FixtureRequest) -> Callable[..., Awaitable[Outcome]]:
    return via_stub if request.param == "stub" else via_client


@pytest.fixture
async def serve_gate(make_settings: Callable[..., Settings], start_sidecar: Any) -> AsyncIterator[Callable[..., Any]]:
    """``await serve_gate(**sections)`` starts the real pipeline over the test tools; returns the UDS address."""
    pipelines = []

    async def start(**sections: dict[str, Any]) -> str:
        settings = make_settings(**sections)
        pipeline = await open_pipeline(settings, registry=Registry.from_tools(tools.ALL))
        pipelines.append(pipeline)
        sidecar = await start_sidecar(settings, pipeline)
        return str(sidecar.addresses[0])

    yield start
    for pipeline in pipelines:
        await pipeline.aclose()


LIMITS = {"max_argument_bytes": 2048, "max_argument_depth": 8}


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"k": value}
    return value


SCENARIOS: dict[str, tuple[str, Any, dict[str, Any], tuple[str, str | None, str | None]]] = {
    # name: (tool, arguments, request fields, (status, code, field))
    "success": ("echo", {"text": "hi"}, {}, ("success", None, None)),
    "invalid JSON": ("echo", '{"text": ', {}, ("error", "INVALID_ARGUMENT", None)),
    "not an object": ("echo", "[1]", {}, ("error", "INVALID_ARGUMENT", None)),
    "wrong type": ("echo", {"text": 5}, {}, ("error", "INVALID_ARGUMENT", "text")),
    "too large": ("nested", {"payload": {"x": "y" * 4096}}, {}, ("error", "INVALID_ARGUMENT", None)),
    "too deep": ("nested", {"payload": deep(12)}, {}, ("error", "INVALID_ARGUMENT", None)),
    "unknown tool": ("no_such_tool", {}, {}, ("error", "TOOL_UNAVAILABLE", None)),
    "hidden tool": ("admin_console", {"text": "x"}, {}, ("error", "TOOL_UNAVAILABLE", None)),
    "permission denied": ("delete_records", {"text": "x"}, {}, ("error", "PERMISSION_DENIED", None)),
    "handler exception": ("boom", {"text": "x"}, {}, ("error", "INTERNAL_ERROR", None)),
    "tool error": ("not_found", {"text": "q3"}, {}, ("error", "RESOURCE_NOT_FOUND", "text")),
    "timeout": ("slow", {"count": 3000}, {}, ("error", "TIMEOUT", None)),
    "approval required": ("send_email", {"text": "x"}, {"idempotency_key": "a-1"},
                          ("approval_required", "APPROVAL_REQUIRED", None)),
    "write without key": ("create_note", {"text": "x"}, {}, ("error", "INVALID_ARGUMENT", "idempotency_key")),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_outcomes(serve_gate: Any, via: Call, name: str) -> None:
    tool, arguments, fields, expected = SCENARIOS[name]
    address = await serve_gate(limits=LIMITS)
    outcome = await via(address, tool, arguments, **fields)
    assert (outcome.status, outcome.code, outcome.field) == expected, outcome
    assert outcome.message is None or "hunter2" not in outcome.message


async def test_hidden_and_unknown_tools_are_indistinguishable(serve_gate: Any, via: Call) -> None:
    address = await serve_gate()
    hidden = await via(address, "admin_console", {"text": "x"})
    unknown = await via(address, "admin_consol", {"text": "x"})
    assert hidden.message == "tool 'admin_console' is not available"
    assert unknown.message == "tool 'admin_consol' is not available"


async def test_handler_secrets_never_reach_the_caller(serve_gate: Any, via: Call) -> None:
    outcome = await via(await serve_gate(), "boom", {"text": "x"})
    assert outcome.message == "the tool failed unexpectedly"


async def test_write_replay_and_key_reuse(serve_gate: Any, via: Call) -> None:
    address = await serve_gate()
    first = await via(address, "create_note", {"text": "a"}, idempotency_key="k-1")
    again = await via(address, "create_note", {"text": "a"}, idempotency_key="k-1")
    reused = await via(address, "create_note", {"text": "b"}, idempotency_key="k-1")
    assert (first.status, first.replayed, again.status, again.replayed) == ("success", False, "success", True)
    assert again.data == first.data
    assert (reused.code, reused.field) == ("IDEMPOTENCY_KEY_REUSED", "idempotency_key")


async def test_reordered_json_keys_are_the_same_request(serve_gate: Any) -> None:
    address = await serve_gate()
    first = await via_stub(address, "file_note", '{"title": "t", "body": "b"}', idempotency_key="order")
    again = await via_stub(address, "file_note", '{ "body": "b",\n "title": "t" }', idempotency_key="order")
    assert first.status == "success" and again.replayed and again.data == first.data


async def test_32_concurrent_duplicates_execute_once(serve_gate: Any) -> None:
    address = await serve_gate()
    before = tools.CREATED.value
    outcomes = await asyncio.gather(*(
        (via_stub if n % 2 else via_client)(address, "create_note", {"text": "dup"}, idempotency_key="dup-32")
        for n in range(32)
    ))
    assert tools.CREATED.value == before + 1
    fresh = [o for o in outcomes if o.status == "success" and not o.replayed]
    assert len(fresh) == 1
    others = {(o.status, o.code, o.replayed) for o in outcomes if o not in fresh}
    assert others <= {("success", None, True), ("error", "OPERATION_IN_PROGRESS", False)}


async def test_read_tool_retries_are_counted(serve_gate: Any, via: Call) -> None:
    outcome = await via(await serve_gate(), "flaky", {"count": 2})
    assert (outcome.status, outcome.attempt) == ("success", 2)


async def test_listing_is_filtered_per_caller(serve_gate: Any, jwt_auth: dict[str, Any],
                                              make_token: Callable[..., str]) -> None:
    address = await serve_gate(auth=jwt_auth)
    seen = {}
    for role in ("developer", "admin"):
        async with AsyncClient(address, token=make_token(roles=[role]), timeout=5) as client:
            seen[role] = {t.name for t in (await client.list_tools()).tools}
    assert seen["admin"] - seen["developer"] == {"admin_console"}
    async with grpc.aio.insecure_channel(address) as channel:
        metadata = (("authorization", f"Bearer {make_token(roles=['admin'])}"),)
        raw = await pb_grpc.ToolServiceStub(channel).ListTools(pb.ListToolsRequest(), metadata=metadata, timeout=5)
    assert {t.name for t in raw.tools} == seen["admin"]
    create_note = next(t for t in raw.tools if t.name == "create_note")
    assert create_note.side_effect == pb.SIDE_EFFECT_INTERNAL_REVERSIBLE and create_note.requires_idempotency_key


@pytest.fixture
def broken_authz(tmp_path: Path) -> Path:
    """The default policies, with an authz rule that fails at evaluation time."""
    root = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "broken"))
    (root / "authz.rego").write_text(
        "package toolbooth.authz\n\nimport rego.v1\n\n"
        'decision := {"allow": to_number(input.principal.id) > 0}\n'
    )
    return root


async def test_policy_failure_fails_closed_and_nothing_runs(serve_gate: Any, via: Call, broken_authz: Path) -> None:
    address = await serve_gate(policy={"path": str(broken_authz)})
    before = tools.CREATED.value
    outcome = await via(address, "create_note", {"text": "x"}, idempotency_key="closed")
    assert (outcome.status, outcome.code) == ("error", "SERVICE_UNAVAILABLE")
    assert "to_number" not in (outcome.message or "")
    assert tools.CREATED.value == before


@pytest.fixture
def broken_availability(tmp_path: Path) -> Path:
    root = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "broken"))
    (root / "availability.rego").write_text(
        'package toolbooth.availability\n\nimport rego.v1\n\ndecision := {"allow": "yes"}\n'
    )
    return root


async def test_listing_fails_closed_with_unavailable(serve_gate: Any, broken_availability: Path) -> None:
    address = await serve_gate(policy={"path": str(broken_availability)})
    async with AsyncClient(address, timeout=5) as client:
        with pytest.raises(ClientError) as caught:
            await client.list_tools()
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE
    assert "yes" not in caught.value.details
