"""The PydanticAI adapter: a toolset of the caller's available tools that calls the sidecar.

Needs the extra ``pydantic-ai`` (``pip install 'toolbooth[pydantic-ai]'``)::

    async with AsyncClient(target, token=jwt) as client:
        agent = Agent("openai:gpt-5", toolsets=[SidecarToolset(client)])
        result = await agent.run("What is 15% of 200?")

``SidecarToolset`` lists the tools at every step of a run (``get_tools``), so a change of the policies shows
at the next step; each has the descriptor's name, description and input schema, and PydanticAI decides per
provider whether to ask for strict mode (``ToolDefinition.strict`` is left unset: OpenAI gets it when the
schema is strict-compatible). The arguments go to the sidecar as the model wrote them: the sidecar validates
them, and its typed error reaches the model like any result. The tool's return value is the typed result as
JSON (``sidecar.integrations.calls.model_view``); a write's idempotency key is derived from the model's tool
call id (``RunContext.tool_call_id``, ``calls.idempotency_key``).
"""

from __future__ import annotations

from typing import Any

from sidecar.client import AsyncClient
from sidecar.contract import ToolDescriptor
from sidecar.integrations.calls import ToolCalls, model_view, needs_extra

try:
    from pydantic_ai import RunContext, ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema
except ImportError as exc:
    raise ImportError(needs_extra(__name__, "PydanticAI (pydantic-ai-slim)", "pydantic-ai")) from exc

__all__ = ["KEYED", "SidecarToolset"]

KEYED = "toolbooth_requires_idempotency_key"
"""The key of ``ToolDefinition.metadata`` that says whether a tool's calls carry an idempotency key."""

_AS_SENT = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


class SidecarToolset(AbstractToolset[Any]):
    """The tools ``client``'s caller may see, each called through the sidecar.

    ``client`` stays the caller's to close; ``conversation_id`` is sent with every listing and call;
    ``max_retries`` bounds the model's retries of arguments that are not a JSON object (default: the agent's).
    """

    def __init__(self, client: AsyncClient, *, id: str | None = None, conversation_id: str | None = None,
                 max_retries: int | None = None) -> None:
        self._calls = ToolCalls(client, conversation_id=conversation_id)
        self._id = id
        self._max_retries = max_retries

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        retries = ctx.max_retries if self._max_retries is None else self._max_retries
        return {descriptor.name: ToolsetTool(toolset=self, tool_def=_definition(descriptor), max_retries=retries,
                                             args_validator=_AS_SENT)
                for descriptor in await self._calls.available()}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> dict[str, Any]:
        keyed = bool((tool.tool_def.metadata or {}).get(KEYED))
        return model_view(await self._calls.call(name, tool_args, ctx.tool_call_id, keyed=keyed))


def _definition(descriptor: ToolDescriptor) -> ToolDefinition:
    return ToolDefinition(name=descriptor.name, description=descriptor.description,
                          parameters_json_schema=descriptor.input_schema,
                          metadata={KEYED: descriptor.requires_idempotency_key,
                                    "toolbooth_side_effect": descriptor.side_effect.value,
                                    "toolbooth_version": descriptor.version})
