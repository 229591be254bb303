"""Names a policy must not give its rules: those of OPA's built-in functions and their namespaces.

In OPA, a rule, function or import named like a built-in (``count``) or the first part of one
(``time`` of ``time.now_ns``) hides it in its package: a call to it then means the rule. OPA refuses
the policy when the hidden built-in is called (``undefined function data.p.time.now_ns``) — even
implicitly: ``x in xs`` is a call to ``internal.member_2``, ``a + b`` one to ``plus`` — or quietly calls
the package's own function instead (``count(x) := 1``). regorus never lets a rule hide a built-in, so
the two engines would disagree. Every load of a policy set (``toolbooth policy check``, ``test``, a
reload, a start) refuses such a name, with what ``shadowing`` says.

The names are those of OPA's built-ins, kept in ``opa_builtins.json`` beside this module (with the OPA
version they come from; a test compares them with that version's engine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

__all__ = ["BUILTINS", "OPA_VERSION", "ref_path", "shadowing"]

_DATA = json.loads(resources.files(__package__).joinpath("opa_builtins.json").read_text(encoding="utf-8"))
OPA_VERSION: str = _DATA["opa"]
BUILTINS: tuple[str, ...] = tuple(_DATA["builtins"])  # every built-in function of OPA_VERSION, by full name
_HIDDEN: dict[str, list[str]] = {}  # each name a rule must not have (a built-in's first part): what it hides
for _name in BUILTINS:
    _HIDDEN.setdefault(_name.split(".")[0], []).append(_name)
_SHOWN = 3  # built-ins named in a message, of a namespace


def shadowing(modules: list[dict[str, Any]]) -> str | None:
    """What in ``modules`` (regorus's AST) hides a built-in: ``file:line: <kind> '<name>' hides OPA's ...``
    for each such name, joined by ``; `` (``None``: nothing)."""
    problems = [f"{module['source']['file']}:{line}: {kind} {name!r} hides OPA's {_described(name, builtins)}: "
                "rename it"
                for module in modules for kind, name, line in _names(module)
                if (builtins := _HIDDEN.get(name)) is not None]
    return "; ".join(problems) or None


def _described(name: str, builtins: list[str]) -> str:
    if builtins == [name]:
        return f"built-in function {name}"
    shown = ", ".join(builtins[:_SHOWN]) + (", ..." if len(builtins) > _SHOWN else "")
    return f"built-in namespace {name} ({shown})"


def _names(module: dict[str, Any]) -> Iterator[tuple[str, str, int]]:
    """``(kind, name, line)`` of every name the module binds in its package: rules (the first part of a
    ``a.b := ...`` head), functions and imports of ``data``/``input`` (their alias, else their last part)."""
    source = module["source"]["contents"].encode()
    for imported in module["ast"]["imports"]:
        path = ref_path(imported["refr"])
        if path[0] in ("data", "input") and len(path) > 1:
            alias = imported.get("as")
            name = source[alias["start"]:alias["end"]].decode() if alias else path[-1]
            yield "import", name, imported["span"]["line"]
    for rule in module["ast"]["rules"]:
        if "Default" in rule:
            ref, kind = rule["Default"]["refr"], "rule"
        else:
            head = rule["Spec"]["head"]
            ref, kind = head[next(iter(head))]["refr"], "function" if "Func" in head else "rule"
        yield kind, ref_path(ref)[0], next(iter(rule.values()))["span"]["line"]


def ref_path(ref: dict[str, Any]) -> list[str]:
    """A reference of regorus's AST, ``a.b["c"]``, as ``["a", "b", "c"]`` (an index not a string as ``""``)."""
    if "Var" in ref:
        return [ref["Var"]["value"]]
    if "RefDot" in ref:
        return [*ref_path(ref["RefDot"]["refr"]), ref["RefDot"]["field"][1]]
    index = ref["RefBrack"]["index"]
    return [*ref_path(ref["RefBrack"]["refr"]), index["String"]["value"] if "String" in index else ""]
