"""The ``opa_client`` errors ``sidecar.policy.opa`` catches (``expression``: OPA's code, or what was wrong)."""

from typing import Any

__all__ = ["DeletePolicyError", "RegoParseError", "TypeException"]

class DeletePolicyError(Exception):
    expression: Any
    message: Any
    def __init__(self, expression: Any, message: Any) -> None: ...

class RegoParseError(Exception):
    expression: Any
    message: Any
    errors: list[dict[str, Any]]
    def __init__(self, expression: Any, message: Any, errors: list[dict[str, Any]] | None = None) -> None: ...

class TypeException(TypeError):
    expression: Any
    def __init__(self, expression: Any) -> None: ...
