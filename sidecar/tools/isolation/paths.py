"""A handler's import path: how a worker process finds a handler with nothing crossing but two strings.

``handler_path`` reads the path from a ``ToolDefinition`` and checks, in the sidecar, that importing it
leads back to that very handler: a function defined at the top level of an importable module (the
``@tool`` decorator leaves the definition under the function's name, which is resolved to its handler).
A nested function, a lambda, a ``functools.partial`` or a function of ``__main__`` has no such path.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from sidecar.tools.definition import Handler, ToolDefinition

__all__ = ["HandlerPath", "handler_path", "resolve"]


@dataclass(frozen=True, slots=True)
class HandlerPath:
    """A module and the qualified name of a handler (or of the tool definition made from it) in it."""

    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


def handler_path(defn: ToolDefinition[Any, Any]) -> HandlerPath:
    """The path that leads back to ``defn``'s handler; ``ValueError`` saying why there is none."""
    module, qualname = getattr(defn.handler, "__module__", None), getattr(defn.handler, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ValueError("its handler has no module and name (define it with def at the top level of a module)")
    path = HandlerPath(module, qualname)
    if module == "__main__" or "<" in qualname:
        raise ValueError(f"its handler {path} cannot be imported by a worker process "
                         "(define it with def at the top level of an importable module)")
    try:
        found = resolve(path)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised: the reason is the message
        raise ValueError(f"its handler's path {path} does not import: {type(exc).__name__}: {exc}") from None
    if found is not defn.handler:
        raise ValueError(f"its handler's path {path} leads to another object than its handler")
    return path


def resolve(path: HandlerPath) -> Handler:
    """Import ``path``: the handler (of the tool definition) it names."""
    target: Any = importlib.import_module(path.module)
    for part in path.qualname.split("."):
        target = getattr(target, part)
    if isinstance(target, ToolDefinition):
        target = target.handler
    if not callable(target):
        raise TypeError(f"{path} is a {type(target).__name__}, not a handler")
    handler: Handler = target
    return handler
