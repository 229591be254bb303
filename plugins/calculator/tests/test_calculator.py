"""Tests of the ``calculate`` tool: operations, validation, limits, through the gate, metadata and packaging."""

from __future__ import annotations

import json
import time
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from sidecar.contract import ErrorCode, Recovery, SideEffect, guidance
from sidecar.plugin import ToolDefinition, ToolError
from sidecar.plugin.fixtures import GateOpener
from sidecar.plugin.testing import Status, make_context
from toolbooth_calculator import MAX_OPERANDS, MAX_RESULT, TOOLS, CalculateInput, CalculateOutput, calculate

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


async def run(operation: str, operands: list[Any]) -> CalculateOutput:
    """Validate the arguments like the pipeline does, then call the tool with the context the sidecar gives it."""
    args = CalculateInput.model_validate({"operation": operation, "operands": operands})
    output = await calculate(args, make_context(calculate))
    assert isinstance(output, CalculateOutput)
    return output


async def tool_error(operation: str, operands: list[Any]) -> ToolError:
    """Run a calculation that must fail with ``ToolError``; return the error."""
    with pytest.raises(ToolError) as caught:
        await run(operation, operands)
    return caught.value


def validation_errors(raw: dict[str, Any] | str) -> list[ErrorDetails]:
    """Validate Python data or a JSON text that must fail; return pydantic's error list."""
    with pytest.raises(ValidationError) as caught:
        if isinstance(raw, str):
            CalculateInput.model_validate_json(raw)
        else:
            CalculateInput.model_validate(raw)
    return caught.value.errors()


# --- operations ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "operands", "result", "expression"),
    [
        ("add", [2, 3], 5, "2 + 3 = 5"),
        ("add", [1.5, 2.25, -0.75], 3, "1.5 + 2.25 + (-0.75) = 3"),
        ("add", [0.1, 0.2], 0.30000000000000004, "0.1 + 0.2 = 0.30000000000000004"),
        ("subtract", [7, 10], -3, "7 - 10 = -3"),
        ("subtract", [2, -3], 5, "2 - (-3) = 5"),
        ("multiply", [4, 2.5], 10, "4 * 2.5 = 10"),
        ("multiply", [2, 3, 4], 24, "2 * 3 * 4 = 24"),
        ("multiply", [0, -1], 0, "0 * (-1) = 0"),
        ("divide", [1, 8], 0.125, "1 / 8 = 0.125"),
        ("divide", [-9, 3], -3, "(-9) / 3 = -3"),
        ("power", [2, 10], 1024, "2 ^ 10 = 1024"),
        ("power", [2, -2], 0.25, "2 ^ (-2) = 0.25"),
        ("power", [-2, 3], -8, "(-2) ^ 3 = -8"),
        ("power", [9, 0.5], 3, "9 ^ 0.5 = 3"),
        ("power", [0, 0], 1, "0 ^ 0 = 1"),
    ],
)
async def test_operations(operation: str, operands: list[float], result: float, expression: str) -> None:
    output = await run(operation, operands)
    assert output.result == result
    assert output.expression == expression


@pytest.mark.parametrize(
    ("operands", "result", "expression"),
    [
        ([15, 200], 30, "15% of 200 = 30"),
        ([50, 7], 3.5, "50% of 7 = 3.5"),
        ([100, 42], 42, "100% of 42 = 42"),
        ([200, 5], 10, "200% of 5 = 10"),
        ([-10, 50], -5, "(-10)% of 50 = -5"),
        ([0, 123], 0, "0% of 123 = 0"),
    ],
)
async def test_percentage_is_p_percent_of_x(operands: list[float], result: float, expression: str) -> None:
    output = await run("percentage", operands)
    assert output.result == pytest.approx(result)
    assert output.expression == expression


async def test_add_and_multiply_accept_the_maximum_operand_count() -> None:
    assert (await run("add", [1] * MAX_OPERANDS)).result == MAX_OPERANDS
    assert (await run("multiply", [1] * MAX_OPERANDS)).result == 1


async def test_negative_zero_result_is_normalised() -> None:
    output = await run("multiply", [-0.0, 5])
    assert str(output.result) == "0.0"


# --- invalid arithmetic ---------------------------------------------------------


@pytest.mark.parametrize("divisor", [0, 0.0, -0.0])
async def test_division_by_zero_is_rejected(divisor: float) -> None:
    error = await tool_error("divide", [1, divisor])
    assert error.code is ErrorCode.INVALID_ARGUMENT
    assert error.field == "operands.1"
    assert "zero" in error.message
    assert error.retryable is None and guidance(error.code) == (False, Recovery.CORRECT_ARGUMENTS)


async def test_zero_to_a_negative_power_is_rejected() -> None:
    error = await tool_error("power", [0, -1])
    assert (error.code, error.field) == (ErrorCode.INVALID_ARGUMENT, "operands.1")


async def test_negative_base_with_fractional_exponent_is_rejected() -> None:
    error = await tool_error("power", [-8, 1 / 3])
    assert (error.code, error.field) == (ErrorCode.INVALID_ARGUMENT, "operands.1")
    assert "complex" in error.message


@pytest.mark.parametrize(
    ("operation", "operands"),
    [
        ("add", [MAX_RESULT, 1]),
        ("subtract", [-MAX_RESULT, 1]),
        ("multiply", [1e8, 1e8]),
        ("divide", [1e10, 1e-10]),
        ("percentage", [1e10, 1e10]),
        ("power", [10, 16]),
    ],
)
async def test_result_magnitude_limit(operation: str, operands: list[float]) -> None:
    error = await tool_error(operation, operands)
    assert error.code is ErrorCode.INVALID_ARGUMENT
    assert f"{MAX_RESULT:g}" in error.message


async def test_result_at_the_limit_is_allowed() -> None:
    assert (await run("power", [10, 15])).result == MAX_RESULT


@pytest.mark.parametrize(
    ("operation", "operands"),
    [
        ("power", [10, 400]),
        ("power", [2, 1e300]),
        ("power", [-8, 1e300]),
        ("power", [0.5, -1e300]),
        ("add", [1.7e308, 1.7e308]),
        ("multiply", [1e300, 1e300]),
        ("divide", [1, 5e-324]),
    ],
)
async def test_overflow_is_rejected(operation: str, operands: list[float]) -> None:
    started = time.monotonic()
    error = await tool_error(operation, operands)
    assert error.code is ErrorCode.INVALID_ARGUMENT
    assert "overflow" in error.message
    assert time.monotonic() - started < 0.5


async def test_a_zero_factor_makes_the_product_zero_even_past_overflow() -> None:
    assert (await run("multiply", [1e300, 1e300, 0])).result == 0


async def test_huge_negative_exponent_underflows_to_zero() -> None:
    assert (await run("power", [2, -1e300])).result == 0


# --- argument validation --------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_python_floats_are_rejected(bad: float) -> None:
    errors = validation_errors({"operation": "add", "operands": [1, bad]})
    assert [(e["type"], e["loc"]) for e in errors] == [("finite_number", ("operands", 1))]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 400])
def test_non_finite_json_numbers_are_rejected(literal: str) -> None:
    text = f'{{"operation":"add","operands":[{literal},1]}}'
    assert [e["loc"] for e in validation_errors(text)] == [("operands", 0)]
    # The sidecar parses with json.loads (which accepts these tokens) before validating.
    assert [e["loc"] for e in validation_errors(json.loads(text))] == [("operands", 0)]


@pytest.mark.parametrize("flag", [True, False])
def test_booleans_are_not_numbers(flag: bool) -> None:
    errors = validation_errors({"operation": "add", "operands": [flag, 1]})
    assert [(e["type"], e["loc"]) for e in errors] == [("float_type", ("operands", 0))]
    errors = validation_errors(f'{{"operation":"add","operands":[{str(flag).lower()},1]}}')
    assert [(e["type"], e["loc"]) for e in errors] == [("float_type", ("operands", 0))]


@pytest.mark.parametrize("text", ["__import__('os').system('x')", "2+3", "2", "1e3"])
def test_strings_are_not_numbers_and_never_evaluated(text: str) -> None:
    errors = validation_errors({"operation": "add", "operands": [text, 1]})
    assert [(e["type"], e["loc"]) for e in errors] == [("float_type", ("operands", 0))]


@pytest.mark.parametrize(
    ("operation", "count"),
    [
        ("add", 1),
        ("add", MAX_OPERANDS + 1),
        ("multiply", 0),
        ("multiply", MAX_OPERANDS + 1),
        ("subtract", 3),
        ("divide", 1),
        ("divide", 3),
        ("percentage", 3),
        ("power", 3),
    ],
)
def test_wrong_operand_count_is_rejected(operation: str, count: int) -> None:
    errors = validation_errors({"operation": operation, "operands": [1] * count})
    assert [e["loc"] for e in errors] == [("operands",)]


def test_operand_count_message_names_the_operation() -> None:
    (error,) = validation_errors({"operation": "power", "operands": [1, 2, 3]})
    assert "'power' takes exactly 2 operands, got 3" in error["msg"]


def test_unknown_operation_is_reported_once() -> None:
    errors = validation_errors({"operation": "modulo", "operands": [1, 2, 3]})
    assert [(e["type"], e["loc"]) for e in errors] == [("literal_error", ("operation",))]


def test_extra_and_missing_fields_are_rejected() -> None:
    errors = validation_errors({"operation": "add", "operands": [1, 2], "expression": "1+2"})
    assert [(e["type"], e["loc"]) for e in errors] == [("extra_forbidden", ("expression",))]
    errors = validation_errors({"operation": "add"})
    assert [(e["type"], e["loc"]) for e in errors] == [("missing", ("operands",))]


def test_input_schema_lists_operations() -> None:
    schema = CalculateInput.model_json_schema()
    assert schema["properties"]["operation"]["enum"] == [
        "add", "subtract", "multiply", "divide", "percentage", "power",
    ]
    operands = schema["properties"]["operands"]
    assert operands["items"] == {"type": "number"}
    assert (operands["minItems"], operands["maxItems"]) == (2, MAX_OPERANDS)
    assert "p / 100 * x" in operands["description"]
    assert schema["additionalProperties"] is False


# --- through the gate ----------------------------------------------------------


async def test_through_the_gate_as_a_caller_gets_it(toolbooth_gate: GateOpener) -> None:
    gate = await toolbooth_gate(TOOLS)
    result = await gate.call(calculate, {"operation": "divide", "operands": [1, 8]})
    assert (result.status, result.data) == (Status.SUCCESS, {"result": 0.125, "expression": "1 / 8 = 0.125"})
    refused = await gate.call(calculate, {"operation": "divide", "operands": [1, 0]})
    assert refused.error is not None and refused.error.code is ErrorCode.INVALID_ARGUMENT
    assert [(event.status, event.error_code) for event in await gate.audit_events()] == [
        ("success", None), ("error", "INVALID_ARGUMENT")]


# --- metadata and packaging -----------------------------------------------------


def test_tool_metadata() -> None:
    assert isinstance(calculate, ToolDefinition)
    assert (calculate.name, calculate.version) == ("calculate", "1.0.0")
    assert calculate.side_effect is SideEffect.NONE
    assert calculate.permissions == ()
    assert calculate.timeout == 0.5
    assert calculate.requires_idempotency_key is False
    assert calculate.is_async is True
    assert calculate.input_model is CalculateInput
    assert calculate.output_model is CalculateOutput
    assert calculate.plugin == "toolbooth_calculator"
    assert "percentage" in calculate.description


def test_entry_point_is_declared() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert project["name"] == "toolbooth-calculator"
    assert project["entry-points"]["toolbooth.tools"] == {"calculator": "toolbooth_calculator:TOOLS"}
    assert TOOLS == [calculate]


def test_installed_entry_point_loads_the_tools() -> None:
    (entry_point,) = metadata.entry_points(group="toolbooth.tools", name="calculator")
    assert entry_point.value == "toolbooth_calculator:TOOLS"
    assert entry_point.load() is TOOLS
