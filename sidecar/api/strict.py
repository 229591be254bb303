"""OpenAI's strict mode for function tools: whether a tool's input schema can take it, and the schema it is sent.

With ``"strict": true`` the model's arguments always match the schema, but OpenAI accepts only a
subset of JSON Schema (its "structured outputs" subset): the root is an object (not ``anyOf``); every
object lists all its properties in ``required`` and sets ``additionalProperties: false``; only the
keywords in ``SUPPORTED_KEYWORDS`` appear (``format`` only with one of ``STRICT_FORMATS``); objects nest
at most ``MAX_DEPTH`` levels. ``strict_problems`` says what stands in the way, by JSON Pointer;
``strict_schema`` is the schema as sent in strict mode: the same instances validate, but the
keywords that only document (``default``, ``examples``) are dropped and a ``$ref`` with sibling
keywords is inlined (strict mode takes a ``$ref`` only alone). Nothing here makes an optional
property required or closes an open object: that would change what the tool accepts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_DEPTH", "STRICT_FORMATS", "SUPPORTED_KEYWORDS", "strict_problem", "strict_problems", "strict_schema"]

SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref", "$defs",
    "definitions", "title", "description", "pattern", "format", "multipleOf", "maximum", "exclusiveMaximum",
    "minimum", "exclusiveMinimum", "minItems", "maxItems",
})
STRICT_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
MAX_DEPTH = 10
_DOCUMENTING = frozenset({"default", "examples"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # keyword -> {name: schema}
_MAX_LISTED = 3


def strict_problem(schema: dict[str, Any]) -> str | None:
    """Why strict mode cannot take ``schema`` (a tool's input schema), in one sentence; ``None`` when it can."""
    problems = strict_problems(schema)
    if not problems:
        return None
    more = len(problems) - _MAX_LISTED
    return "; ".join(problems[:_MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def strict_problems(schema: dict[str, Any]) -> list[str]:
    """Everything in ``schema`` that strict mode does not accept, each naming where (a JSON Pointer)."""
    problems = []
    if schema.get("type") != "object" or "anyOf" in schema:
        problems.append("#: the root must be an object schema (type: object, not anyOf)")
    problems += _problems(strict_schema(schema), "#", depth=0)
    return problems


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as sent with ``"strict": true``: documenting keywords dropped, a ``$ref`` with siblings inlined."""
    definitions = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    return _strict_node(schema, definitions)


def _strict_node(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node and len(node.keys() - _DOCUMENTING) > 1:
        target = _resolve(node["$ref"], definitions)
        if target is not None:
            node = {**target, **{key: value for key, value in node.items() if key != "$ref"}}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DOCUMENTING:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _strict_value(child, definitions) for name, child in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = _strict_value(value, definitions)
        else:
            out[key] = value
    return out


def _strict_value(value: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return _strict_node(value, definitions)
    if isinstance(value, list):
        return [_strict_value(item, definitions) for item in value]
    return value


def _resolve(ref: Any, definitions: dict[str, Any]) -> dict[str, Any] | None:
    for prefix in ("#/$defs/", "#/definitions/"):
        if isinstance(ref, str) and ref.startswith(prefix):
            target = definitions.get(ref.removeprefix(prefix))
            return target if isinstance(target, dict) else None
    return None


def _problems(node: Any, path: str, *, depth: int) -> list[str]:
    if not isinstance(node, dict):
        return [f"{path}: not a schema object"]
    found = [f"{path}: keyword {key!r} is not supported" for key in node if key not in SUPPORTED_KEYWORDS]
    if "format" in node and node["format"] not in STRICT_FORMATS:
        found.append(f"{path}: format {node['format']!r} is not supported")
    is_object = node.get("type") == "object" or "properties" in node
    if is_object:
        depth += 1
        if depth > MAX_DEPTH:
            found.append(f"{path}: objects nest deeper than {MAX_DEPTH} levels")
        if node.get("additionalProperties") is not False:
            found.append(f"{path}: the object must set additionalProperties: false")
        required = set(node.get("required", ()))
        found += [f"{path}/properties/{name}: the property is optional (strict mode needs every property required)"
                  for name in node.get("properties", {}) if name not in required]
    for child, child_path in _children(node, path):
        found += _problems(child, child_path, depth=depth)
    return found


def _children(node: dict[str, Any], path: str) -> Iterator[tuple[Any, str]]:
    for key in _SCHEMA_MAPS:
        for name, child in (node.get(key) or {}).items():
            yield child, f"{path}/{key}/{name}"
    if "items" in node:
        yield node["items"], f"{path}/items"
    for index, child in enumerate(node.get("anyOf") or ()):
        yield child, f"{path}/anyOf/{index}"
