"""Stage 4 (validate, ``sidecar.pipeline.order``): turn untrusted ``arguments_json`` into the tool's input model.

Limits are checked before anything is parsed into a model: byte size first (before
``json.loads``), then nesting depth. JSON that has no canonical form (RFC 8785, see
``sidecar.canonical``) is refused too, since every call is hashed: ``NaN`` and ``Infinity``,
numbers that overflow to infinity (``1e400``), integers beyond ±(2^53 - 1) and lone surrogates
(``"\\ud800"``). Every failure becomes an ``INVALID_ARGUMENT`` error with the path of the
offending field, so the model can correct it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ValidationError

from sidecar.canonical import MAX_SAFE_INTEGER, CanonicalizationError, canonical_bytes
from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.errors import ArgumentError

__all__ = ["canonical_arguments", "check_canonical", "parse_arguments", "valid_unicode"]


class _Constant(str):
    """``NaN``, ``Infinity`` or ``-Infinity`` as ``json.loads`` met it: kept so its path can be named."""


def parse_arguments(
    arguments_json: str, model: type[BaseModel], *, max_bytes: int, max_depth: int
) -> BaseModel:
    """Check limits, parse JSON and validate against ``model``; raise ``ArgumentError``."""
    try:
        size = len(arguments_json.encode())
    except UnicodeEncodeError:
        raise _one("arguments are not valid UTF-8") from None
    if size > max_bytes:
        raise _one(f"arguments are {size} bytes; the limit is {max_bytes}")
    try:
        value = json.loads(arguments_json or "{}", parse_constant=_Constant)
    except RecursionError:
        raise _one("arguments are not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal too long to convert
        raise _one(f"arguments are not valid JSON: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(value, dict):
        raise _one(f"arguments must be a JSON object, got {_json_type(value)}")
    _check_tree(value, max_depth)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ArgumentError([_from_pydantic(err) for err in exc.errors(include_url=False)]) from None


def check_canonical(data: Any) -> None:
    """Raise ``ArgumentError`` naming the first value of ``data`` (validated arguments) without a canonical
    form, e.g. an integer the input model made from a long string of digits."""
    _check_tree(data, None)


def canonical_arguments(data: Any) -> bytes:
    """The canonical form (RFC 8785) of ``data`` (validated arguments); ``ArgumentError`` as ``check_canonical``
    raises it for data that has none."""
    try:
        return canonical_bytes(data)
    except CanonicalizationError:
        check_canonical(data)  # names the field
        raise _one("the arguments have no canonical JSON form (RFC 8785)") from None


def _check_tree(value: object, max_depth: int | None) -> None:
    """One iterative walk (no recursion limit): depth past ``max_depth``, or the first value JCS cannot hold.
    The walk keeps no paths; only a tree with a problem is walked again to name its field."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            if max_depth is not None and level > max_depth:
                raise _one(f"arguments are nested deeper than {max_depth} levels")
            if not all(valid_unicode(key) for key in node):
                _locate(value)
            stack.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list):
            if max_depth is not None and level > max_depth:
                raise _one(f"arguments are nested deeper than {max_depth} levels")
            stack.extend((child, level + 1) for child in node)
        elif _problem(node):
            _locate(value)


def _locate(value: object) -> None:
    """Raise the ``ArgumentError`` of the first value of ``value`` without a canonical form, naming its field."""
    stack: list[tuple[object, tuple[str, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if not valid_unicode(key):
                    raise _one("a key is not valid Unicode (a lone surrogate)", _field((*path, key)))
                stack.append((child, (*path, key)))
        elif isinstance(node, list):
            stack.extend((child, (*path, str(index))) for index, child in enumerate(node))
        elif problem := _problem(node):
            field = _field(path)
            raise _one(f"{field}: {problem}" if field else problem, field)
    raise AssertionError("a problem found once is found again")


def _problem(node: object) -> str | None:
    if isinstance(node, _Constant):
        return f"{node} is not a JSON number"
    if isinstance(node, str):
        return None if valid_unicode(node) else "the string is not valid Unicode (a lone surrogate)"
    if isinstance(node, float) and not math.isfinite(node):
        return "the number is out of range (not a finite double)"
    if isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_SAFE_INTEGER:
        return f"integers must be within ±{MAX_SAFE_INTEGER} (2^53 - 1)"
    return None


def valid_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (has no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _field(path: tuple[str, ...]) -> str:
    """The dotted path, any lone surrogate in it written as an escape (the path itself must be sendable)."""
    return ".".join(part.encode("utf-8", "backslashreplace").decode() for part in path)


def _one(message: str, field: str | None = None) -> ArgumentError:
    return ArgumentError([ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, message, field=field or None)])


def _from_pydantic(err: Any) -> ErrorInfo:
    path = _field(tuple(str(part) for part in err["loc"]))
    message = f"{path}: {err['msg']}" if path else err["msg"]
    return ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, message, field=path or None)


def _json_type(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
