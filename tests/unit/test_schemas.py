"""Provider tool schemas: OpenAI (strict where the schema allows it), Anthropic and MCP tool objects."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field

from sidecar.api import schemas
from sidecar.api.strict import strict_problem, strict_problems, strict_schema
from sidecar.contract import ErrorCode, ErrorInfo, ResultMeta, SideEffect, Status, ToolDescriptor, ToolResult
from sidecar.plugin import ToolContext, tool
from sidecar.tools.registry import describe


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int = Field(description="across")
    y: int


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(examples=["home"])
    start: Point = Field(description="where it starts")
    stops: list[Point] = Field(min_length=1)


@tool(name="plan_route", version="2.0.0", side_effect=SideEffect.NONE, title="Plan a route")
async def plan_route(args: Route, ctx: ToolContext) -> Route:
    """Plan a route through its stops."""
    return args


PLAN = describe(plan_route)


def descriptor(input_schema: dict[str, Any], side_effect: SideEffect = SideEffect.NONE) -> ToolDescriptor:
    return ToolDescriptor(name="t", version="1", description="d", input_schema=input_schema, side_effect=side_effect,
                          requires_idempotency_key=side_effect is not SideEffect.NONE, timeout_ms=1000)


def closed(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


# --- OpenAI strict mode ----------------------------------------------------------------------------------------


def test_a_closed_schema_with_every_property_required_is_strict() -> None:
    assert strict_problem(PLAN.input_schema) is None
    tool_object = schemas.openai_tool(PLAN)
    assert tool_object["type"] == "function" and tool_object["function"]["strict"] is True
    assert tool_object["function"]["name"] == "plan_route"


def test_strict_mode_drops_documenting_keywords_and_inlines_a_ref_with_siblings() -> None:
    sent = strict_schema(PLAN.input_schema)
    assert "examples" not in sent["properties"]["name"]
    assert PLAN.input_schema["properties"]["start"] == {"$ref": "#/$defs/Point", "description": "where it starts"}
    assert sent["properties"]["start"]["properties"]["x"] == {"description": "across", "title": "X", "type": "integer"}
    assert sent["properties"]["start"]["description"] == "where it starts" and "$ref" not in sent["properties"]["start"]
    assert sent["properties"]["stops"]["items"] == {"$ref": "#/$defs/Point"}  # alone: kept
    # validation is unchanged: the same instances pass and fail
    start = {"x": 0, "y": 0}
    for instance, valid in [({"name": "a", "start": start, "stops": [{"x": 1, "y": 2}]}, True),
                            ({"name": "a", "start": start, "stops": []}, False),
                            ({"name": "a", "start": {"x": 0}, "stops": [start]}, False)]:
        assert jsonschema.Draft202012Validator(sent).is_valid(instance) is valid
        assert jsonschema.Draft202012Validator(PLAN.input_schema).is_valid(instance) is valid


@pytest.mark.parametrize(("schema", "problem"), [
    (closed(text={"type": "string", "maxLength": 5}), "#/properties/text: keyword 'maxLength' is not supported"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
     "#: the object must set additionalProperties: false"),
    ({**closed(a={"type": "string"}), "required": []},
     "#/properties/a: the property is optional (strict mode needs every property required)"),
    (closed(when={"type": "string", "format": "uri"}), "#/properties/when: format 'uri' is not supported"),
    (closed(one={"allOf": [{"type": "string"}]}), "#/properties/one: keyword 'allOf' is not supported"),
    ({"anyOf": [closed(), closed()]}, "#: the root must be an object schema (type: object, not anyOf)"),
    (closed(items={"type": "array", "items": closed(deep={"type": "string", "minLength": 1})}),
     "#/properties/items/items/properties/deep: keyword 'minLength' is not supported"),
])
def test_a_schema_strict_mode_cannot_take_says_why_and_where(schema: dict[str, Any], problem: str) -> None:
    assert problem in strict_problems(schema)
    tool_object = schemas.openai_tool(descriptor(schema))
    assert tool_object["function"]["strict"] is False
    assert tool_object["function"]["parameters"] == schema  # sent as the tool declares it


def test_objects_nested_too_deeply_are_not_strict() -> None:
    schema: dict[str, Any] = closed(leaf={"type": "string"})
    for _ in range(10):
        schema = closed(inner=schema)
    assert "objects nest deeper than 10 levels" in (strict_problem(schema) or "")


def test_the_reason_lists_three_problems_and_counts_the_rest() -> None:
    schema = closed(**{name: {"type": "string", "maxLength": 1} for name in "abcde"})
    assert (strict_problem(schema) or "").endswith("; and 2 more")


# --- Anthropic and MCP -------------------------------------------------------------------------------------------


def test_anthropic_tools_have_name_description_and_input_schema() -> None:
    assert schemas.anthropic_tool(PLAN) == {"name": "plan_route", "description": "Plan a route through its stops.",
                                            "input_schema": PLAN.input_schema}


def test_an_mcp_tool_has_schemas_title_annotations_and_toolbooth_meta() -> None:
    found = schemas.mcp_tool(PLAN)
    assert (found["name"], found["title"], found["inputSchema"]) == ("plan_route", "Plan a route", PLAN.input_schema)
    assert found["_meta"] == {"toolbooth/version": "2.0.0", "toolbooth/side_effect": "none",
                              "toolbooth/requires_idempotency_key": False, "toolbooth/timeout_ms": 10000}
    assert "title" not in schemas.mcp_tool(descriptor(closed()))  # clients show the name


@pytest.mark.parametrize(("effect", "hints"), [
    (SideEffect.NONE, (True, False, True, False)),
    (SideEffect.INTERNAL_REVERSIBLE, (False, False, False, False)),
    (SideEffect.EXTERNAL_REVERSIBLE, (False, False, False, True)),
    (SideEffect.EXTERNAL_IRREVERSIBLE, (False, True, False, True)),
])
def test_annotations_follow_the_side_effect(effect: SideEffect, hints: tuple[bool, ...]) -> None:
    found = schemas.mcp_tool(descriptor(closed(), effect))["annotations"]
    assert tuple(found[name] for name in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")) \
        == hints


def test_the_output_schema_is_the_typed_result_with_the_tools_data() -> None:
    schema = schemas.mcp_tool(PLAN)["outputSchema"]
    check = jsonschema.Draft202012Validator(schema)
    check.check_schema(schema)
    meta = ResultMeta(request_id="r", tool="plan_route")
    data = {"name": "a", "start": {"x": 0, "y": 0}, "stops": [{"x": 1, "y": 2}]}
    success = ToolResult(status=Status.SUCCESS, data=data, meta=meta)
    failure = ToolResult(status=Status.ERROR, meta=meta,
                         error=ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "no", field="stops"),
                         errors=(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "no", field="stops"),))
    assert check.is_valid(success.model_dump(mode="json"))  # the data's $defs resolve at the root
    assert check.is_valid(failure.model_dump(mode="json"))
    wrong = success.model_copy(update={"data": {**data, "stops": [{"x": "one", "y": 2}]}})
    assert not check.is_valid(wrong.model_dump(mode="json"))


def test_unknown_formats_are_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown tool schema format 'gemini'; use one of openai, anthropic, mcp"):
        schemas.tool_schemas([PLAN], "gemini")
    assert [t["name"] for t in schemas.tool_schemas([PLAN], "anthropic")] == ["plan_route"]
