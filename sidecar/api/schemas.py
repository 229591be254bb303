"""Tool descriptors as model providers and MCP take them: OpenAI function tools, Anthropic tools, MCP tools.

``tool_schemas(tools, format)`` is what ``Client.tool_schemas`` and ``toolbooth tools export`` give, and
``mcp_tool`` is also what the sidecar's MCP server lists, so the three never disagree:

- ``openai``: a Chat Completions function tool, ``{"type": "function", "function": {name, description,
  parameters, strict}}``; ``strict`` is true when the input schema allows it (``sidecar.api.strict``;
  ``strict_problem`` says why not). The Responses API takes ``{"type": "function", **tool["function"]}``.
- ``anthropic``: ``{name, description, input_schema}``.
- ``mcp``: an MCP ``Tool``: ``name``, ``title`` (when the tool has one), ``description``, ``inputSchema``,
  ``outputSchema`` (``result_schema``: the typed result a call returns as ``structuredContent``, its
  ``data`` typed by the tool's output schema), ``annotations`` from the side effect (``tool_annotations``)
  and ``_meta`` with Toolbooth's own facts under ``toolbooth/`` keys.

Pure data in, plain JSON-ready dicts out: nothing here needs the ``mcp`` package or a server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from sidecar.api.strict import strict_problem, strict_schema
from sidecar.contract import SideEffect, ToolDescriptor, ToolResult

__all__ = ["META_PREFIX", "SchemaFormat", "anthropic_tool", "mcp_tool", "openai_tool",
           "result_schema", "schema_format", "strict_problem", "tool_annotations", "tool_schemas"]

META_PREFIX = "toolbooth/"


class SchemaFormat(StrEnum):
    """The shapes ``tool_schemas`` writes."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    MCP = "mcp"


def schema_format(value: SchemaFormat | str) -> SchemaFormat:
    """``value`` as a format; ``ValueError`` naming the formats for an unknown one."""
    try:
        return SchemaFormat(value)
    except ValueError:
        raise ValueError(f"unknown tool schema format {value!r}; use one of "
                         f"{', '.join(f.value for f in SchemaFormat)}") from None


def tool_schemas(tools: Iterable[ToolDescriptor], format: SchemaFormat | str) -> list[dict[str, Any]]:
    """Every tool of ``tools`` in ``format`` (``schema_format``'s error for an unknown one)."""
    convert = _CONVERTERS[schema_format(format)]
    return [convert(tool) for tool in tools]


def openai_tool(tool: ToolDescriptor) -> dict[str, Any]:
    """An OpenAI function tool, strict when its input schema allows it."""
    strict = strict_problem(tool.input_schema) is None
    parameters = strict_schema(tool.input_schema) if strict else copy.deepcopy(tool.input_schema)
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": parameters, "strict": strict}}


def anthropic_tool(tool: ToolDescriptor) -> dict[str, Any]:
    """An Anthropic tool."""
    return {"name": tool.name, "description": tool.description, "input_schema": copy.deepcopy(tool.input_schema)}


def mcp_tool(tool: ToolDescriptor) -> dict[str, Any]:
    """An MCP ``Tool`` object, as ``tools/list`` returns it."""
    found: dict[str, Any] = {"name": tool.name}
    if tool.title:
        found["title"] = tool.title
    found.update({
        "description": tool.description,
        "inputSchema": copy.deepcopy(tool.input_schema),
        "outputSchema": result_schema(tool.output_schema),
        "annotations": tool_annotations(tool.side_effect),
        "_meta": {f"{META_PREFIX}{name}": value for name, value in (
            ("version", tool.version), ("side_effect", tool.side_effect.value),
            ("requires_idempotency_key", tool.requires_idempotency_key), ("timeout_ms", tool.timeout_ms))},
    })
    return found


def tool_annotations(side_effect: SideEffect) -> dict[str, bool]:
    """MCP's tool hints for a side-effect class (reference design: none < internal reversible < external
    reversible < external irreversible).

    ``readOnlyHint``: no effect at all. ``destructiveHint``: the effect cannot be undone (external and
    irreversible); a reversible one is not destructive. ``idempotentHint``: only for a tool without effects,
    since a write repeated with the same arguments but another idempotency key runs again (the same key
    replays). ``openWorldHint``: the effects reach outside systems (external).
    """
    return {
        "readOnlyHint": side_effect is SideEffect.NONE,
        "destructiveHint": side_effect is SideEffect.EXTERNAL_IRREVERSIBLE,
        "idempotentHint": side_effect is SideEffect.NONE,
        "openWorldHint": side_effect in (SideEffect.EXTERNAL_REVERSIBLE, SideEffect.EXTERNAL_IRREVERSIBLE),
    }


def result_schema(data_schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a ``ToolResult`` as JSON (``model_dump(mode="json")``) whose ``data`` is
    ``data_schema`` or null. The result's own definitions are inlined, so only ``data_schema``'s
    ``$defs`` are left at the root, where its references expect them."""
    schema = copy.deepcopy(_RESULT)
    data = {key: value for key, value in copy.deepcopy(data_schema).items() if key != "$defs"}
    schema["properties"]["data"] = {"anyOf": [data, {"type": "null"}]} if data else {}
    if "$defs" in data_schema:
        schema["$defs"] = copy.deepcopy(data_schema["$defs"])
    return schema


def _inlined(node: Any, definitions: dict[str, Any]) -> Any:
    """``node`` with every ``#/$defs/NAME`` reference replaced by the definition (they do not recurse)."""
    if isinstance(node, list):
        return [_inlined(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/$defs/"):
        target = definitions[node["$ref"].removeprefix("#/$defs/")]
        node = {**target, **{key: value for key, value in node.items() if key != "$ref"}}
    return {key: _inlined(value, definitions) for key, value in node.items()}


def _result() -> dict[str, Any]:
    schema = ToolResult.model_json_schema(mode="serialization")
    definitions = schema.pop("$defs")
    return dict(_inlined(schema, definitions))


_RESULT = _result()
_CONVERTERS = {SchemaFormat.OPENAI: openai_tool, SchemaFormat.ANTHROPIC: anthropic_tool, SchemaFormat.MCP: mcp_tool}
