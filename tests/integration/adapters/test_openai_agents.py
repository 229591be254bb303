"""The OpenAI Agents SDK adapter through a real sidecar, driven by the SDK's own ``ScriptedModel``.

No network and no LLM: each model reply is scripted, and what the model received back is read from the
model's recorded calls (the ``function_call_output`` items of its next input). The SDK needs no API key with
a model object of its own, and tracing is off for every run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, OperationState, Recovery, Status
from sidecar.integrations.calls import idempotency_key
from sidecar.integrations.openai_agents import function_tools
from tests.support import tools

pytestmark = pytest.mark.integration

Reply = Sequence[Any]  # the output items of one model reply


async def run(client: AsyncClient, *replies: Reply) -> ScriptedModel:
    """Run an agent whose model gives ``replies``, then a final text; the model, with the calls it received."""
    model = ScriptedModel([*replies, [assistant_message("done")]])
    agent = Agent(name="assistant", model=model, tools=await function_tools(client))
    result = await Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == "done"
    model.assert_complete()
    return model


def seen(model: ScriptedModel) -> list[tuple[str, dict[str, Any]]]:
    """The tool outputs the model read, in order: (call id, the JSON result)."""
    last = model.last_call
    assert last is not None
    return [(item["call_id"], json.loads(item["output"])) for item in last.input
            if isinstance(item, dict) and item.get("type") == "function_call_output"]


async def test_the_model_is_offered_the_available_tools_with_their_schemas(client: AsyncClient) -> None:
    model = await run(client)
    assert model.first_call is not None
    offered = {tool.name: tool for tool in model.first_call.tools}
    listing = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert "admin_console" not in offered  # hidden from the developer by the availability policy
    assert sorted(offered) == sorted(listing)
    echo: Any = offered["echo"]
    assert echo.description == listing["echo"].description
    assert echo.params_json_schema == listing["echo"].input_schema
    assert echo.strict_json_schema  # closed, every property required: strict as it is
    nested: Any = offered["nested"]
    assert not nested.strict_json_schema  # an open object: offered as it is, not strict
    assert nested.params_json_schema == listing["nested"].input_schema


async def test_a_call_and_its_typed_result_reach_the_model(client: AsyncClient) -> None:
    model = await run(client, [function_call("echo", {"text": "hello"}, call_id="call_1")])
    [(call_id, result)] = seen(model)
    assert call_id == "call_1"
    assert result["status"] == Status.SUCCESS
    assert result["data"] == {"text": "hello", "principal": "dev", "attempt": 1}
    assert result["error"] is None
    assert result["meta"]["tool"] == "echo"


async def test_invalid_arguments_reach_the_model_as_the_typed_error(client: AsyncClient) -> None:
    model = await run(client, [function_call("echo", {"text": 5}, call_id="call_1"),
                               function_call("not_found", {"text": "q3"}, call_id="call_2")])
    [(_, invalid), (_, missing)] = seen(model)
    assert invalid["status"] == Status.ERROR
    assert invalid["error"] == {"code": ErrorCode.INVALID_ARGUMENT, "message": "text: Input should be a valid string",
                                "retryable": False, "recovery": Recovery.CORRECT_ARGUMENTS, "field": "text",
                                "details": None}
    assert missing["error"]["code"] == ErrorCode.RESOURCE_NOT_FOUND
    assert missing["error"]["message"] == "no document named 'q3'"


async def test_a_write_is_keyed_by_the_tool_call_id_and_the_same_call_run_again_replays(client: AsyncClient) -> None:
    """Within one run the SDK answers a tool call id once; a run made again from the same reply (resumed, or
    retried after a failure) runs the same tool call again: its derived key replays the stored result."""
    before = tools.CREATED.value
    [(_, first)] = seen(await run(client, [function_call("create_note", {"text": "a"}, call_id="call_w1")]))
    [(_, again)] = seen(await run(client, [function_call("create_note", {"text": "a"}, call_id="call_w1")]))
    [(_, new)] = seen(await run(client, [function_call("create_note", {"text": "a"}, call_id="call_w2")]))
    assert tools.CREATED.value == before + 2
    assert first["status"] == again["status"] == new["status"] == Status.SUCCESS
    assert again["data"] == first["data"] and again["meta"]["idempotency_replayed"]
    assert not first["meta"]["idempotency_replayed"] and not new["meta"]["idempotency_replayed"]
    assert new["data"] != first["data"]
    operation = await client.get_operation("create_note", idempotency_key("call_w1"))
    assert operation.state is OperationState.COMPLETED
    assert operation.result is not None and operation.result.data == first["data"]


async def test_approval_required_is_shown_to_the_model_with_its_preview(client: AsyncClient) -> None:
    model = await run(client, [function_call("send_email", {"text": "to the board"}, call_id="call_m")])
    [(_, result)] = seen(model)
    assert result["status"] == Status.APPROVAL_REQUIRED
    assert result["error"]["code"] == ErrorCode.APPROVAL_REQUIRED
    assert result["error"]["recovery"] == Recovery.REQUEST_USER_INPUT
    preview = result["preview"]
    assert preview["state"] == "pending" and preview["preview_hash"].startswith("sha256:")
    assert json.loads(preview["call_json"])["arguments"] == {"text": "to the board"}
    assert [p.preview_id for p in await client.previews()] == [preview["preview_id"]]
