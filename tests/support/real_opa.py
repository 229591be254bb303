"""OPA's own engine in the tests: opa-golib-python-bindings, OPA v1.20.2 in this process (through ctypes).

``bindings()`` imports it, or skips the test (fails it under ``CI=true``) when it is not installed.
``compiled`` gives an engine holding modules and data, compiled as OPA does; ``rego_errors`` reads the
errors out of what the engine raises; ``rego_tests`` finds the ``test_*`` rules and ``failed_tests`` runs
them as ``opa test`` does; ``engine_builtins`` lists the engine's built-in functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.required import missing

__all__ = ["INSTALL", "RegoError", "bindings", "compiled", "engine_builtins", "failed_tests", "rego_errors",
           "rego_tests"]

INSTALL = "pip install --ignore-requires-python --only-binary=:all: opa-golib-python-bindings==0.4.4"

_PREAMBLE = re.compile(r"^(?:[\w ]+: )?\d+ errors? occurred:\s*")  # e.g. "bundle activation failed: 2 errors occurred:"
_ERROR = re.compile(r"^(?P<file>\S.*?):(?P<row>\d+): (?P<code>[a-z_]+): ", re.MULTILINE)
_CARET = re.compile(r"^\t(?P<line>.*)\n\t(?P<pad> *)\^$", re.MULTILINE)
_PACKAGE = re.compile(r"^package\s+([\w.]+)", re.MULTILINE)
_TEST_RULE = re.compile(r"^(test_\w*)(?=\s*(?:if\b|\{|:?=|$))", re.MULTILINE)  # functions (``test_x(a)``) are not tests
_CAPABILITIES = re.compile(rb'\{\s*"builtins"\s*:\s*\[')
_CAPABILITIES_SIZE = 1 << 20  # bytes: more than one capabilities document takes


def bindings() -> ModuleType:
    """The ``opa_bindings`` module; a missing dependency (``tests.support.required``) when not installed."""
    try:
        import opa_bindings
    except ImportError:
        missing("OPA's engine (opa-golib-python-bindings) is not installed", install=INSTALL)
    return opa_bindings


@dataclass(frozen=True)
class RegoError:
    """One error as OPA reports it; ``col`` only when the engine shows it (a parse error's caret)."""

    file: str
    row: int
    code: str
    message: str
    col: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The error as OPA's REST API writes it."""
        location: dict[str, Any] = {"file": self.file, "row": self.row}
        if self.col is not None:
            location["col"] = self.col
        return {"code": self.code, "message": self.message, "location": location}


def rego_errors(text: str) -> list[RegoError]:
    """The errors in an ``OpaError``'s message: ``file:row: code: message``, each maybe followed by the
    source line and a caret under the column."""
    text = _PREAMBLE.sub("", text)
    starts = list(_ERROR.finditer(text))
    found = []
    for match, after in zip(starts, [*starts[1:], None], strict=True):
        body = text[match.end():after.start() if after else len(text)].rstrip("\n")
        caret = _CARET.search(body)
        message = body[:caret.start()].rstrip("\n") if caret else body
        found.append(RegoError(match["file"], int(match["row"]), match["code"], message,
                               len(caret["pad"]) + 1 if caret else None))
    return found


def compiled(modules: Iterable[tuple[str, str]], data: Any = None) -> Any:
    """An ``OpaEngine`` holding the ``(name, text)`` modules and ``data``, compiled (else ``OpaError``)."""
    engine = bindings().OpaEngine()
    for name, text in modules:
        engine.add_policy(name, text)
    if data:
        engine.add_data(data)
    engine.eval_query("true")  # OPA compiles every module when it prepares the first query
    return engine


def rego_tests(modules: Iterable[tuple[str, str]]) -> list[str]:
    """``data.<package>.test_*`` of every test rule of the ``(name, text)`` modules, as ``opa test`` finds them."""
    found: dict[str, None] = {}
    for _, text in modules:
        if package := _PACKAGE.search(text):
            found.update((f"data.{package[1]}.{name}", None) for name in _TEST_RULE.findall(text))
    return list(found)


def failed_tests(engine: Any, rules: Iterable[str]) -> dict[str, str]:
    """Each rule of ``rules`` that does not pass as in ``opa test`` (its value is ``true``), with why."""
    failures = {}
    for rule in rules:
        try:
            answer = engine.eval_query(f"x = {rule}")
        except bindings().OpaError as exc:
            failures[rule] = f"error: {exc.message}"
            continue
        if not answer or answer[0]["x"] is not True:
            failures[rule] = f"{json.dumps(answer[0]['x'])}, not true" if answer else "undefined"
    return failures


def engine_builtins() -> set[str]:
    """The engine's built-in functions: those named in the OPA capabilities documents its library holds (one per
    OPA release, as ``opa capabilities --version`` prints them) that the engine knows."""
    library = (Path(str(bindings().__file__)).parent / "libopabridge.so").read_bytes()
    decoder, named = json.JSONDecoder(), set()
    for start in _CAPABILITIES.finditer(library):
        window = library[start.start():start.start() + _CAPABILITIES_SIZE].decode(errors="replace")
        document, _ = decoder.raw_decode(window)
        named |= {builtin["name"] for builtin in document["builtins"]}
    return {name for name in named if _known(name)}


def _known(name: str) -> bool:
    """Whether the engine has a built-in function ``name``: calling it with no arguments is not refused as
    undefined (but, where it takes some, for its arity)."""
    try:
        compiled([("probe.rego", f"package probe\n\nr := {name}()\n")])
    except bindings().OpaError as exc:
        return "undefined function" not in exc.message
    return True
