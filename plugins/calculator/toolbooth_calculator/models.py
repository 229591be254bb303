"""Input and output models of the ``calculate`` tool; their JSON schema is what the model sees."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator

Operation = Literal["add", "subtract", "multiply", "divide", "percentage", "power"]

MAX_OPERANDS = 100
"""Most operands ``add`` and ``multiply`` accept."""

OPERAND_COUNTS: dict[Operation, tuple[int, int]] = {
    "add": (2, MAX_OPERANDS),
    "multiply": (2, MAX_OPERANDS),
    "subtract": (2, 2),
    "divide": (2, 2),
    "percentage": (2, 2),
    "power": (2, 2),
}
"""Inclusive (least, most) operand count per operation."""

# A JSON number only: strict mode rejects booleans and numeric strings; NaN, Infinity
# and literals too large for a float (they parse to infinity) are rejected as well.
Operand = Annotated[float, Strict(), AllowInfNan(False)]

_OPERANDS_HELP = (
    "Finite numbers (JSON numbers, not strings or booleans). "
    f"add: 2 to {MAX_OPERANDS} numbers, summed. "
    "subtract: [a, b] gives a - b. "
    f"multiply: 2 to {MAX_OPERANDS} numbers, multiplied. "
    "divide: [a, b] gives a / b; b must not be 0. "
    "percentage: [p, x] gives p percent of x, i.e. p / 100 * x; [15, 200] gives 30. "
    "power: [base, exponent] gives base raised to exponent; "
    "a negative base needs a whole-number exponent."
)


class CalculateInput(BaseModel):
    """One arithmetic operation on a list of numbers."""

    model_config = ConfigDict(extra="forbid")

    operation: Operation = Field(description="The operation to apply to the operands, in order.")
    operands: list[Operand] = Field(
        min_length=2, max_length=MAX_OPERANDS, description=_OPERANDS_HELP, examples=[[2, 3], [15, 200]]
    )

    @field_validator("operands")
    @classmethod
    def _check_count(cls, operands: list[float], info: ValidationInfo) -> list[float]:
        """Enforce the operand count of the chosen operation (skipped if the operation is invalid)."""
        operation = info.data.get("operation")
        if operation is None:
            return operands
        least, most = OPERAND_COUNTS[operation]
        if not least <= len(operands) <= most:
            wanted = f"exactly {least}" if least == most else f"{least} to {most}"
            raise ValueError(f"{operation!r} takes {wanted} operands, got {len(operands)}")
        return operands


class CalculateOutput(BaseModel):
    """The result of one calculation."""

    model_config = ConfigDict(extra="forbid")

    result: float = Field(description="The numeric result.")
    expression: str = Field(description="The calculation written out, e.g. '2 + 3 = 5'.")
