"""Stage 3: turn untrusted ``arguments_json`` into the tool's input model.

Limits are checked before anything is parsed into a model: byte size first (before
``json.loads``), then nesting depth. Every failure becomes an ``INVALID_ARGUMENT``
error with the path of the offending field, so the model can correct it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.errors import ArgumentError

__all__ = ["parse_arguments"]


def parse_arguments(
    arguments_json: str, model: type[BaseModel], *, max_bytes: int, max_depth: int
) -> BaseModel:
    """Check limits, parse JSON and validate against ``model``; raise ``ArgumentError``."""
    size = len(arguments_json.encode())
    if size > max_bytes:
        raise _one(f"arguments are {size} bytes; the limit is {max_bytes}")
    try:
        value = json.loads(arguments_json or "{}")
    except RecursionError:
        raise _one("arguments are not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal too long to convert
        raise _one(f"arguments are not valid JSON: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(value, dict):
        raise _one(f"arguments must be a JSON object, got {_json_type(value)}")
    if _depth(value, max_depth) > max_depth:
        raise _one(f"arguments are nested deeper than {max_depth} levels")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ArgumentError([_from_pydantic(err) for err in exc.errors(include_url=False)]) from None


def _one(message: str) -> ArgumentError:
    return ArgumentError([ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, message)])


def _from_pydantic(err: Any) -> ErrorInfo:
    path = ".".join(str(part) for part in err["loc"])
    message = f"{path}: {err['msg']}" if path else err["msg"]
    return ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, message, field=path or None)


def _depth(value: object, limit: int) -> int:
    """Nesting depth of a JSON value, stopping once past ``limit`` (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if not isinstance(node, dict | list):
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, level + 1) for child in children)
    return deepest


def _json_type(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
