"""The public face, checked: the docs import only public modules, and what plugin authors are promised stays.

``plugin_api.json`` is the promise of ``sidecar.plugin`` and ``sidecar.plugin_cli``: each exported name with
its signature (a class: its constructor and public members; an enum: its members). A name removed, a parameter
removed, renamed, made required or moved, or an annotation changed fails; a name or an optional parameter added
needs the snapshot written again: ``.venv/bin/python tests/unit/test_public_api.py``.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

import sidecar
from sidecar import PUBLIC_MODULES

REPO = Path(sidecar.__file__).resolve().parent.parent
SNAPSHOT = Path(__file__).with_name("plugin_api.json")
PROMISED = ("sidecar.plugin", "sidecar.plugin_cli")
# What outside users read; docs/architecture.md is for those who change the sidecar, whose internals it explains.
DOCS = sorted([REPO / "README.md", *(path for path in (REPO / "docs").glob("*.md") if path.name != "architecture.md")])
_IMPORT = re.compile(r"^\s*(?:from\s+(sidecar[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)|import\s+(sidecar[\w.]*))", re.M)
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)

Shape = dict[str, Any]


def _parameters(item: Any) -> list[str]:
    """Each parameter as ``"name KIND[ optional]: annotation"``; none for what has no signature."""
    try:
        signature = inspect.signature(item)
    except (TypeError, ValueError):
        return []
    return [f"{p.name} {p.kind.name}{' optional' if p.default is not p.empty else ''}: "
            f"{'' if p.annotation is p.empty else p.annotation}" for p in signature.parameters.values()]


def _returns(item: Any) -> str:
    try:
        returns = inspect.signature(item).return_annotation
    except (TypeError, ValueError):
        return ""
    return "" if returns is inspect.Signature.empty else str(returns)


def shape(item: Any) -> Shape:
    """What a name promises: its kind and signature, a class's public members, an enum's values (a class whose
    constructor is another library's, as ``Parser``'s is ``argparse``'s, promises only its own members)."""
    if isinstance(item, type) and issubclass(item, enum.Enum):
        return {"kind": "enum", "members": sorted(str(member.value) for member in item)}
    if isinstance(item, type):
        members = {name: shape(getattr(item, name)) for name, member in sorted(vars(item).items())
                   if not name.startswith("_") and (callable(member) or isinstance(member, property))}
        own = "__signature__" in vars(item) or getattr(item.__init__, "__module__", "").startswith("sidecar")
        return {"kind": "class", "parameters": _parameters(item) if own else [], "members": members}
    if isinstance(item, property):
        return {"kind": "property", "returns": _returns(item.fget)}
    if callable(item):
        return {"kind": "function", "parameters": _parameters(item), "returns": _returns(item)}
    return {"kind": "value", "type": type(item).__name__}


def current() -> dict[str, dict[str, Shape]]:
    """The promised modules' exported names and their shapes, as the code has them now."""
    modules = {name: importlib.import_module(name) for name in PROMISED}
    return {name: {item: shape(getattr(module, item)) for item in sorted(module.__all__)}
            for name, module in modules.items()}


def narrowing(before: Shape, now: Shape, where: str) -> list[str]:
    """How ``now`` breaks a caller of ``before``; nothing when it accepts every call ``before`` did."""
    if before["kind"] != now["kind"]:
        return [f"{where} was a {before['kind']}, is a {now['kind']}"]
    problems = [] if before.get("returns") == now.get("returns") else [f"{where} returns {now.get('returns')}"]
    problems += [f"{where} lost {gone}" for gone in sorted(set(before.get("members", [])) - set(now.get("members", [])))
                 if before["kind"] == "enum"]
    for member, member_before in before.get("members", {}).items() if before["kind"] == "class" else ():
        member_now = now["members"].get(member)
        problems += ([f"{where}.{member} is gone"] if member_now is None
                     else narrowing(member_before, member_now, f"{where}.{member}"))
    return problems + _narrower_parameters(before.get("parameters", []), now.get("parameters", []), where)


def _narrower_parameters(before: list[str], now: list[str], where: str) -> list[str]:
    old, new = ({p.partition(" ")[0]: p for p in side} for side in (before, now))
    problems = [f"{where}: ({parameter}) is now ({new.get(name)})" for name, parameter in old.items()
                if new.get(name) not in {parameter, parameter.replace(":", " optional:", 1)}]
    problems += [f"{where}: ({parameter}) is a new required parameter" for name, parameter in new.items()
                 if name not in old and "optional" not in parameter.split(":")[0] and " VAR_" not in parameter]
    kept, positional = ([p.partition(" ")[0] for p in side if " POSITIONAL" in p] for side in (before, now))
    if positional[: len(kept)] != kept:
        problems.append(f"{where}: the positional parameters were {kept}, are {positional}")
    return problems


def test_no_promised_name_or_signature_is_narrowed() -> None:
    promised, now = json.loads(SNAPSHOT.read_text()), current()
    problems = [problem for module, names in promised.items() for name, before in names.items()
                for problem in (narrowing(before, now[module][name], f"{module}.{name}") if name in now[module]
                                else [f"{module}.{name} is gone"])]
    assert not problems, "a promise to plugin authors is broken:\n" + "\n".join(problems)


def test_the_snapshot_is_the_promise_as_the_code_has_it() -> None:
    """A name or an optional parameter added is a promise made: the snapshot is written again to say so."""
    assert json.loads(SNAPSHOT.read_text()) == current(), f"write it again: .venv/bin/python {Path(__file__)}"


def test_a_narrowed_signature_is_seen() -> None:
    def before(a: int, *, b: str = "") -> None: ...
    def wider(a: int, c: int = 0, *, b: str = "", d: int = 1) -> None: ...
    def narrower(a: int, c: int, *, b: str) -> None: ...

    assert narrowing(shape(before), shape(wider), "f") == []
    assert narrowing(shape(before), shape(narrower), "f") == [
        "f: (b KEYWORD_ONLY optional: str) is now (b KEYWORD_ONLY: str)",
        "f: (c POSITIONAL_OR_KEYWORD: int) is a new required parameter"]


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def doc_imports(text: str) -> list[str]:
    """The sidecar modules the code blocks of a Markdown text import."""
    imports = []
    for block in _FENCE.findall(text):
        for module, names, plain in _IMPORT.findall(block):
            named = [f"{module}.{name.split()[0]}" for name in names.strip("()").split(",") if name.strip()]
            imports += [plain] if plain else [name if _is_module(name) else module for name in named]
    return imports


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_the_docs_import_only_public_modules(path: Path) -> None:
    wrong = sorted({name for name in doc_imports(path.read_text()) if name not in PUBLIC_MODULES})
    assert not wrong, f"{path.name}'s code imports internal modules: {wrong}"


def test_the_docs_imports_are_seen() -> None:
    text = "```python\nfrom sidecar import plugin\nfrom sidecar.client import (\n Client,\n)\nimport sidecar.cli\n```"
    assert doc_imports(text) == ["sidecar.plugin", "sidecar.client", "sidecar.cli"]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_module_curates_its_all(name: str) -> None:
    assert isinstance(importlib.import_module(name).__all__, list), name


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
