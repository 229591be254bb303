"""What a handler ends with besides its output: ``ToolError`` (re-exported by ``sidecar.plugin``) and ``Partial``.

A handler that fails raises ``ToolError(code, message, field=..., retryable=..., safe_details=...)``: its
``message`` and ``safe_details`` (a JSON object of at most ``MAX_SAFE_DETAILS_BYTES``) are the only text of
the handler's that reaches the model; anything else it raises becomes a generic ``INTERNAL_ERROR``.

A handler that did part of its work returns ``Partial(output, errors=[ToolError(...), ...])``: the output
(checked against the tool's output model like any output) says what was done, each ``ToolError`` names a
part that failed with its own code; the caller gets ``PARTIAL_SUCCESS``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from sidecar.canonical import CanonicalizationError, canonical_bytes
from sidecar.contract import ErrorCode, ErrorInfo, SideEffect

__all__ = ["MAX_SAFE_DETAILS_BYTES", "Partial", "ToolError", "published"]

MAX_SAFE_DETAILS_BYTES = 4096  # of canonical JSON: details are for a decision, not a payload

Out = TypeVar("Out", bound=BaseModel)


class ToolError(Exception):
    """The only way a handler's own text reaches the model.

    ``retryable`` defaults to the standard guidance for ``code`` and the tool's side effect (a timeout of
    a write tool is not retryable). ``safe_details``: domain details the tool marks safe to show the model
    (e.g. ``{"rejected": ["a@example.org"]}``), a dict of JSON values of at most ``MAX_SAFE_DETAILS_BYTES``
    as canonical JSON; a copy is kept. A code outside ``ErrorCode``, or details that are not such a dict,
    raise ``ValueError`` here (a handler that raises it ends with ``INTERNAL_ERROR``).
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        field: str | None = None,
        retryable: bool | None = None,
        safe_details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.field = field
        self.retryable = retryable
        self.safe_details = None if safe_details is None else _checked_details(safe_details)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by keyword (an exception pickles its positional ``args`` only): it crosses to and from
        worker processes, inside a ``Partial`` too."""
        return _rebuilt, (self.code.value, self.message, self.field, self.retryable, self.safe_details)


def _rebuilt(code: str, message: str, field: str | None, retryable: bool | None,
             safe_details: dict[str, Any] | None) -> ToolError:
    return ToolError(code, message, field=field, retryable=retryable, safe_details=safe_details)


def _checked_details(details: object) -> dict[str, Any]:
    if not isinstance(details, dict) or not all(isinstance(key, str) for key in details):
        raise ValueError(f"safe_details must be a dict with string keys, got {type(details).__name__}")
    try:
        encoded = canonical_bytes(details)
    except CanonicalizationError as exc:
        raise ValueError(f"safe_details must hold JSON values only (no NaN, no integer beyond 2^53): {exc}") from None
    if len(encoded) > MAX_SAFE_DETAILS_BYTES:
        raise ValueError(f"safe_details is {len(encoded)} bytes as JSON, above the limit of {MAX_SAFE_DETAILS_BYTES}")
    copy: dict[str, Any] = json.loads(encoded)
    return copy


@dataclass(frozen=True, slots=True)
class Partial(Generic[Out]):
    """A result with completed and failed parts: ``output`` (the tool's output model, or data that fits it)
    says what was done; ``errors``, at least one, the parts that failed, each with its own code. The caller
    gets status ``partial_success`` with the output as ``data`` and these errors; for a tool with side
    effects it is stored under the call's key and replayed as such."""

    output: Out | dict[str, Any]
    errors: Sequence[ToolError]

    def __post_init__(self) -> None:
        errors = tuple(self.errors)
        if not errors or not all(isinstance(error, ToolError) for error in errors):
            raise ValueError("Partial needs at least one ToolError in errors: one for each part that failed")
        object.__setattr__(self, "errors", errors)


def published(exc: ToolError, side_effect: SideEffect) -> ErrorInfo:
    """``exc`` as the caller sees it: its code with the standard guidance for the tool's side effect (unless
    the tool set ``retryable``), its message, field and safe details."""
    info = ErrorInfo.of(exc.code, exc.message, field=exc.field, side_effect=side_effect, details=exc.safe_details)
    return info if exc.retryable is None else info.model_copy(update={"retryable": exc.retryable})
