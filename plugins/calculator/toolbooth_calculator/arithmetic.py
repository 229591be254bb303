"""Float arithmetic for ``calculate``: no code evaluation, constant work per operand."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sidecar.plugin import ErrorCode, ToolError
from toolbooth_calculator.models import Operation

MAX_RESULT = 1e15
"""Largest result magnitude ``calculate`` returns."""

_INTEGER_TEXT_LIMIT = 1e16
_SYMBOLS: dict[Operation, str] = {"add": " + ", "subtract": " - ", "multiply": " * ", "divide": " / ", "power": " ^ "}


def compute(operation: Operation, operands: Sequence[float]) -> float:
    """Apply ``operation`` to ``operands``; raise ``ToolError`` if the result is not allowed."""
    try:
        value = _OPERATIONS[operation](operands)
    except OverflowError:
        raise _too_large("the result overflowed: it is too large to represent") from None
    if not math.isfinite(value):
        raise _too_large("the result overflowed: it is too large to represent")
    if abs(value) > MAX_RESULT:
        raise _too_large(f"the result {value:g} is too large: its magnitude must be at most {MAX_RESULT:g}")
    return value + 0.0  # turns -0.0 into 0.0


def describe(operation: Operation, operands: Sequence[float], result: float) -> str:
    """Write the calculation out for a human, e.g. ``"15% of 200 = 30"``."""
    terms = [_operand_text(x) for x in operands]
    left = f"{terms[0]}% of {terms[1]}" if operation == "percentage" else _SYMBOLS[operation].join(terms)
    return f"{left} = {format_number(result)}"


def format_number(value: float) -> str:
    """Whole numbers without a trailing ``.0``; others as Python's shortest round-trip repr."""
    if value.is_integer() and abs(value) < _INTEGER_TEXT_LIMIT:
        return str(int(value))
    return repr(value)


def _operand_text(value: float) -> str:
    text = format_number(value)
    return f"({text})" if value < 0 else text


def _add(operands: Sequence[float]) -> float:
    return math.fsum(operands)


def _subtract(operands: Sequence[float]) -> float:
    return operands[0] - operands[1]


def _multiply(operands: Sequence[float]) -> float:
    if 0 in operands:  # exact, even when the other factors' product would overflow
        return 0.0
    return math.prod(operands)


def _divide(operands: Sequence[float]) -> float:
    dividend, divisor = operands
    if divisor == 0:
        raise ToolError(ErrorCode.INVALID_ARGUMENT, "cannot divide by zero", field="operands.1")
    return dividend / divisor


def _percentage(operands: Sequence[float]) -> float:
    percent, whole = operands
    return percent / 100 * whole


def _power(operands: Sequence[float]) -> float:
    base, exponent = operands
    if base == 0 and exponent < 0:
        raise ToolError(ErrorCode.INVALID_ARGUMENT, "0 cannot be raised to a negative power", field="operands.1")
    if base < 0 and not exponent.is_integer():
        raise ToolError(ErrorCode.INVALID_ARGUMENT,
                        "a negative base needs a whole-number exponent; the result would be a complex number",
                        field="operands.1")
    return math.pow(base, exponent)  # floats only: constant time, raises OverflowError instead of growing


def _too_large(message: str) -> ToolError:
    return ToolError(ErrorCode.INVALID_ARGUMENT, message, field="operands")


_OPERATIONS: dict[Operation, Callable[[Sequence[float]], float]] = {
    "add": _add,
    "subtract": _subtract,
    "multiply": _multiply,
    "divide": _divide,
    "percentage": _percentage,
    "power": _power,
}
