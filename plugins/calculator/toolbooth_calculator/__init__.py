"""Toolbooth calculator plugin: the side-effect-free ``calculate`` tool.

Exposed to the sidecar through the ``toolbooth.tools`` entry point ``calculator``,
which names ``TOOLS``.
"""

from __future__ import annotations

from typing import Any

from sidecar.plugin import SideEffect, ToolContext, ToolDefinition, tool
from toolbooth_calculator.arithmetic import MAX_RESULT, compute, describe
from toolbooth_calculator.models import MAX_OPERANDS, CalculateInput, CalculateOutput

__all__ = ["MAX_OPERANDS", "MAX_RESULT", "TOOLS", "CalculateInput", "CalculateOutput", "calculate"]

DESCRIPTION = (
    "Arithmetic on numbers: add, subtract, multiply, divide, percentage (p percent of x) and power. "
    "Use it instead of calculating in your head. "
    f"Results must be finite with a magnitude of at most {MAX_RESULT:g}."
)


@tool(name="calculate", version="1.0.0", side_effect=SideEffect.NONE, permissions=(), timeout=0.5,
      description=DESCRIPTION)
async def calculate(args: CalculateInput, ctx: ToolContext) -> CalculateOutput:
    """Compute ``args.operation`` over ``args.operands``."""
    result = compute(args.operation, args.operands)
    return CalculateOutput(result=result, expression=describe(args.operation, args.operands, result))


TOOLS: list[ToolDefinition[Any, Any]] = [calculate]
