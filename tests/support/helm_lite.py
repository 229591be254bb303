"""Render the Helm chart's templates without Helm: the small part of Go templates the chart uses, nothing more.

What is understood: text and ``{{ ... }}`` actions with Go's whitespace trimming (``{{-`` removes the
whitespace before the action, newlines included; ``-}}`` the whitespace after it); comments
``{{/* ... */}}``; ``if``/``else``/``end`` with Go's truth (false, 0, nil, "" and empty collections are
false); pipelines ``ARG | FUNC ARG... | ...`` (each stage's value is the last argument of the next) over
``.Values.a.b``, ``.Release.Name``, ``.Chart.AppVersion`` (``.Chart`` fields as Chart.yaml spells them),
quoted strings and integers; and the functions ``toYaml`` (sorted keys, no trailing newline, as Helm's),
``toJson``, ``nindent``, ``quote``, ``default`` and ``not``. Any other construct (``range``, ``with``,
``include``, variables, other functions) raises ``Unsupported``: a template that needs more fails here
instead of being rendered wrongly. Real ``helm template`` may still differ in what this does not model
(Sprig's exact string quoting, schema validation, ``.Capabilities``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Unsupported", "render", "render_chart"]

_ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.DOTALL)
_INT = re.compile(r"-?\d+\Z")


class Unsupported(ValueError):
    """A template construct this renderer does not implement."""


def _to_yaml(value: Any) -> str:
    return "" if value is None else yaml.safe_dump(value, sort_keys=True, default_flow_style=False).rstrip("\n")


def _nindent(width: int, text: str) -> str:
    return "\n" + "\n".join((" " * width + line) if line else line for line in str(text).split("\n"))


def _quote(value: Any) -> str:
    return json.dumps("" if value is None else str(value))


def _default(fallback: Any, value: Any = None) -> Any:
    return value if _truth(value) else fallback


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "toYaml": _to_yaml, "toJson": lambda value: json.dumps(value, separators=(",", ":")), "nindent": _nindent,
    "quote": _quote, "default": _default, "not": lambda value: not _truth(value),
}


def _truth(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, (list, dict, tuple)) and not value)


def _argument(token: str, scope: Mapping[str, Any]) -> Any:
    if token.startswith('"'):
        return json.loads(token)
    if _INT.match(token):
        return int(token)
    if token.startswith(".") and re.fullmatch(r"(\.[A-Za-z_][A-Za-z0-9_]*)+", token):
        value: Any = scope
        for part in token[1:].split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value
    raise Unsupported(f"argument {token!r}")


def _pipeline(text: str, scope: Mapping[str, Any]) -> Any:
    value: Any = _NOTHING
    for stage in text.split("|"):
        tokens = shlex.split(stage.strip(), posix=False)
        if not tokens:
            raise Unsupported(f"empty pipeline stage in {text!r}")
        head, *rest = tokens
        if head in FUNCTIONS:
            arguments = [_argument(token, scope) for token in rest] + ([] if value is _NOTHING else [value])
            value = FUNCTIONS[head](*arguments)
        elif value is _NOTHING and not rest:
            value = _argument(head, scope)
        else:
            raise Unsupported(f"{head!r} in {text!r}")
    return value


_NOTHING = object()


def render(template: str, scope: Mapping[str, Any]) -> str:
    """``template`` rendered with ``scope`` (``{"Values": ..., "Release": ..., "Chart": ...}``)."""
    pieces: list[str | tuple[str, str]] = []
    position = 0
    for match in _ACTION.finditer(template):
        text = template[position:match.start()]
        if match.group(1):
            text = text.rstrip()
        pieces.append(text)
        pieces.append(("right" if match.group(3) else "", match.group(2)))
        position = match.end()
    pieces.append(template[position:])
    # Right trims apply to the text after the action.
    out_pieces: list[str | tuple[str, str]] = []
    trim_next = False
    for piece in pieces:
        if isinstance(piece, str):
            out_pieces.append(piece.lstrip() if trim_next else piece)
            trim_next = False
        else:
            trim_next = piece[0] == "right"
            out_pieces.append(piece)
    output, _ = _block(out_pieces, 0, scope, active=True)
    return output


def _block(pieces: list[str | tuple[str, str]], index: int, scope: Mapping[str, Any], *,
           active: bool) -> tuple[str, int]:
    """Render from ``index`` to the ``else``/``end`` closing this block (or the end); the text and where it
    stopped."""
    out: list[str] = []
    while index < len(pieces):
        piece = pieces[index]
        if isinstance(piece, str):
            out.append(piece if active else "")
            index += 1
            continue
        action = piece[1]
        if action.startswith("/*") and action.endswith("*/"):
            index += 1
        elif action.startswith("if "):
            condition = active and _truth(_pipeline(action[3:], scope))
            body, index = _block(pieces, index + 1, scope, active=condition)
            out.append(body)
            if _action(pieces[index]) == "else":
                body, index = _block(pieces, index + 1, scope, active=active and not condition)
                out.append(body)
            if _action(pieces[index]) != "end":
                raise Unsupported(f"'if {action[3:]}' without its end")
            index += 1
        elif action in ("else", "end"):
            return "".join(out), index
        else:
            value = _pipeline(action, scope) if active else ""
            out.append("" if value is None else str(value))
            index += 1
    return "".join(out), index


def _action(piece: str | tuple[str, str]) -> str | None:
    return piece[1] if isinstance(piece, tuple) else None


def _merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, Mapping) and isinstance(
            merged.get(key), Mapping) else value
    return merged


def render_chart(chart: Path, *, release: str = "demo", namespace: str = "default",
                 values: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every ``templates/*.yaml`` of ``chart`` rendered (``values`` over values.yaml, as ``--set`` would) and
    parsed: the documents of each template, by file name."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    scope = {"Values": _merge(yaml.safe_load((chart / "values.yaml").read_text()), values or {}),
             "Release": {"Name": release, "Namespace": namespace},
             "Chart": {key[:1].upper() + key[1:]: value for key, value in meta.items()}}
    return {path.name: [doc for doc in yaml.safe_load_all(render(path.read_text(), scope)) if doc]
            for path in sorted((chart / "templates").glob("*.yaml"))}
