"""The OpenAI Agents SDK adapter: the caller's available tools as ``FunctionTool``s that call the sidecar.

Needs the extra ``openai-agents`` (``pip install 'toolbooth[openai-agents]'``)::

    async with AsyncClient(target, token=jwt) as client:
        agent = Agent(name="assistant", tools=await function_tools(client))
        result = await Runner.run(agent, "What is 15% of 200?")

Each tool has the descriptor's name, description and input schema (``params_json_schema``); the schema is
marked strict (``strict_json_schema``) only when it already is one — the SDK's own strict conversion would
leave it unchanged (every object closed with ``additionalProperties: false``, every property required) — so
what the model may send is exactly what the tool accepts. The tool's output to the model is the typed result
as JSON (``sidecar.integrations.calls.model_view``); a write's idempotency key is derived from the model's
tool call id (``ToolContext.tool_call_id``, ``calls.idempotency_key``). The listing is taken once, when the
tools are made: make them again to see a change of the policies (every call is still gated when it runs).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sidecar.client import AsyncClient
from sidecar.contract import ToolDescriptor
from sidecar.integrations.calls import ToolCalls, model_view, needs_extra

try:
    from agents import FunctionTool
    from agents.exceptions import UserError
    from agents.strict_schema import ensure_strict_json_schema
    from agents.tool_context import ToolContext
except ImportError as exc:
    raise ImportError(needs_extra(__name__, "the OpenAI Agents SDK (openai-agents)", "openai-agents")) from exc

__all__ = ["function_tool", "function_tools", "strict_compatible"]


async def function_tools(client: AsyncClient, *, conversation_id: str | None = None) -> list[FunctionTool]:
    """A ``FunctionTool`` for each tool the caller may see now, all calling the sidecar through ``client``."""
    calls = ToolCalls(client, conversation_id=conversation_id)
    return [function_tool(calls, descriptor) for descriptor in await calls.available()]


def function_tool(calls: ToolCalls, descriptor: ToolDescriptor) -> FunctionTool:
    """The ``FunctionTool`` of one listed tool; ``calls`` makes its calls."""

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        result = await calls.call(descriptor.name, arguments, context.tool_call_id,
                                  keyed=descriptor.requires_idempotency_key)
        return json.dumps(model_view(result), ensure_ascii=False)

    return FunctionTool(name=descriptor.name, description=descriptor.description,
                        params_json_schema=copy.deepcopy(descriptor.input_schema), on_invoke_tool=invoke,
                        strict_json_schema=strict_compatible(descriptor.input_schema))


def strict_compatible(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` is a strict schema as it is: the SDK's strict conversion accepts it and changes nothing."""
    try:
        return ensure_strict_json_schema(copy.deepcopy(schema)) == schema
    except (UserError, ValueError, TypeError, KeyError, AssertionError):  # what the conversion raises on refusal
        return False
