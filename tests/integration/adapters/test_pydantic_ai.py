"""The PydanticAI adapter through a real sidecar, driven by PydanticAI's own ``FunctionModel`` and ``TestModel``.

No network and no LLM: a ``Script`` gives the model's replies, one per step, and records what the model was
offered and what it read back (the ``ToolReturnPart``s of the requests it got).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import ToolDefinition

from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, OperationState, Recovery, Status
from sidecar.integrations.calls import idempotency_key
from sidecar.integrations.pydantic_ai import SidecarToolset
from tests.support import tools

pytestmark = pytest.mark.integration


class Script:
    """A model that makes the given tool calls, one reply per step, then says ``done``."""

    def __init__(self, *replies: Sequence[ToolCallPart]) -> None:
        self.replies = list(replies)
        self.offered: list[list[ToolDefinition]] = []
        self.returns: list[ToolReturnPart] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.offered.append(info.function_tools)
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        self.returns += [part for part in last.parts if isinstance(part, ToolReturnPart)]
        return ModelResponse(parts=list(self.replies.pop(0)) if self.replies else [TextPart("done")])

    def results(self) -> list[tuple[str, dict[str, Any]]]:
        """What the model read back, in order: (tool call id, the JSON result)."""
        return [(part.tool_call_id, part.content) for part in self.returns]


async def run(toolset: SidecarToolset, *replies: Sequence[ToolCallPart]) -> Script:
    script = Script(*replies)
    result = await Agent(FunctionModel(script), toolsets=[toolset]).run("go")
    assert result.output == "done" and not script.replies
    return script


def call(tool: str, args: dict[str, Any] | str, call_id: str) -> ToolCallPart:
    return ToolCallPart(tool, args, tool_call_id=call_id)


async def test_the_model_is_offered_the_available_tools_with_their_schemas(client: AsyncClient) -> None:
    script = await run(SidecarToolset(client))
    offered = {tool.name: tool for tool in script.offered[0]}
    listing = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert "admin_console" not in offered  # hidden from the developer by the availability policy
    assert sorted(offered) == sorted(listing)
    for name, descriptor in listing.items():
        assert offered[name].description == descriptor.description
        assert offered[name].parameters_json_schema == descriptor.input_schema
    assert offered["create_note"].metadata is not None and offered["create_note"].metadata[
        "toolbooth_requires_idempotency_key"]


async def test_a_call_and_its_typed_result_reach_the_model(client: AsyncClient) -> None:
    script = await run(SidecarToolset(client), [call("echo", {"text": "hello"}, "call_1")])
    [(call_id, result)] = script.results()
    assert call_id == "call_1"
    assert result["status"] == Status.SUCCESS
    assert result["data"] == {"text": "hello", "principal": "dev", "attempt": 1}
    assert result["meta"]["tool"] == "echo"


async def test_the_test_model_calls_a_tool_with_arguments_from_its_schema(client: AsyncClient) -> None:
    result = await Agent(TestModel(call_tools=["echo"]), toolsets=[SidecarToolset(client)]).run("go")
    [returned] = [part for message in result.all_messages() for part in message.parts
                  if isinstance(part, ToolReturnPart)]
    assert returned.tool_name == "echo"
    assert returned.content["status"] == Status.SUCCESS and returned.content["data"]["principal"] == "dev"


async def test_invalid_arguments_reach_the_model_as_the_typed_error(client: AsyncClient) -> None:
    script = await run(SidecarToolset(client), [call("echo", {"text": 5}, "call_1"),
                                                call("echo", '{"txt": "hello"}', "call_2")])
    [(_, wrong_type), (_, wrong_name)] = script.results()
    assert wrong_type["status"] == Status.ERROR
    assert wrong_type["error"] == {"code": ErrorCode.INVALID_ARGUMENT, "retryable": False, "field": "text",
                                   "message": "text: Input should be a valid string",
                                   "recovery": Recovery.CORRECT_ARGUMENTS, "details": None}
    assert wrong_name["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    assert {e["field"] for e in wrong_name["errors"]} == {"text", "txt"}


async def test_a_write_is_keyed_by_the_tool_call_id_and_a_repeated_call_replays(client: AsyncClient) -> None:
    before = tools.CREATED.value
    script = await run(SidecarToolset(client),
                       [call("create_note", {"text": "a"}, "call_w1")],
                       [call("create_note", {"text": "a"}, "call_w1")],  # the same tool call, again
                       [call("create_note", {"text": "a"}, "call_w2")])  # a new one
    [(_, first), (_, again), (_, new)] = script.results()
    assert tools.CREATED.value == before + 2
    assert first["status"] == again["status"] == new["status"] == Status.SUCCESS
    assert again["data"] == first["data"] and again["meta"]["idempotency_replayed"]
    assert not first["meta"]["idempotency_replayed"] and not new["meta"]["idempotency_replayed"]
    assert new["data"] != first["data"]
    operation = await client.get_operation("create_note", idempotency_key("call_w1"))
    assert operation.state is OperationState.COMPLETED


async def test_approval_required_is_shown_to_the_model_with_its_preview(client: AsyncClient) -> None:
    script = await run(SidecarToolset(client), [call("send_email", {"text": "to the board"}, "call_m")])
    [(_, result)] = script.results()
    assert result["status"] == Status.APPROVAL_REQUIRED
    assert result["error"]["code"] == ErrorCode.APPROVAL_REQUIRED
    assert result["error"]["recovery"] == Recovery.REQUEST_USER_INPUT
    assert result["preview"]["state"] == "pending"
    assert [p.preview_id for p in await client.previews()] == [result["preview"]["preview_id"]]


async def test_arguments_that_are_no_json_object_are_sent_back_to_the_model_to_retry(client: AsyncClient) -> None:
    script = await run(SidecarToolset(client, max_retries=1), [call("echo", "[1, 2]", "call_1")],
                       [call("echo", {"text": "fixed"}, "call_2")])
    retried, fixed = script.returns
    assert retried.outcome == "retried" and retried.content[0]["msg"] == "Input should be an object"
    assert fixed.content["status"] == Status.SUCCESS and fixed.content["data"]["text"] == "fixed"
