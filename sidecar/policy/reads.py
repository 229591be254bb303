"""Which members of a call's history each decision may read: ``input.history`` (meters, failures) and
``input.conversation`` (labels), for the decisions made after the history stage (authz, approval).

A decision's rule lives in its package (``data.toolbooth.authz``); it may use any package its modules refer to
(``data.toolbooth.lib.f(...)``, ``import data.toolbooth.lib``), and those theirs. A decision may read a member when
one of the modules it may use mentions the member's name outside a comment (``input.history.meters``,
``h := input.history``): a decision whose modules never name it gets an input without it, so its decisions stay in
the decision cache while a meter's count changes with every call. A module that reads ``data`` as a whole
(``data[x]``, ``walk(data, ...)``) may use every package. The convention is the one for ``labels`` and
``failures`` (``sidecar.policy.history``): a policy that builds the name at run time (``input[concat("", ...)]``)
is not seen; name the member.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from sidecar.policy.decision import RULES, Stage

__all__ = ["ALL_MEMBERS", "HISTORY_STAGES", "decision_reads"]

ALL_MEMBERS = frozenset({"history", "conversation"})
HISTORY_STAGES = (Stage.AUTHZ, Stage.APPROVAL)  # the decisions made with the call's history

_TOKENS = re.compile(r'"(?:\\.|[^"\\])*"|`[^`]*`|#[^\n]*')  # strings and comments
_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)", re.MULTILINE)
_REFERENCE = re.compile(r"(?<![.\w])data((?:\s*\.\s*[A-Za-z_]\w*)*)")  # ``data`` and the path after it


def decision_reads(modules: Sequence[tuple[str, str]]) -> dict[Stage, frozenset[str]]:
    """For each decision of ``HISTORY_STAGES``, the members of ``ALL_MEMBERS`` its modules may read, from the
    ``(path, text)`` of every policy module."""
    parsed = [_Module.of(text) for _, text in modules]
    return {stage: _members(_closure(parsed, _package_of(stage))) for stage in HISTORY_STAGES}


class _Module:
    """One module's package, the documents it refers to (``""``: ``data`` as a whole), and its text without
    comments (where a member is named, in a string too)."""

    __slots__ = ("package", "references", "text")

    def __init__(self, package: str, references: frozenset[str], text: str) -> None:
        self.package, self.references, self.text = package, references, text

    @classmethod
    def of(cls, source: str) -> _Module:
        text = _TOKENS.sub(lambda token: "" if token.group().startswith("#") else token.group(), source)
        code = _TOKENS.sub('""', source)  # without strings either: "read restricted data" refers to nothing
        found = _PACKAGE.search(code)
        references = frozenset(re.sub(r"\s", "", match.group(1)).lstrip(".") for match in _REFERENCE.finditer(code))
        return cls(found.group(1) if found else "", references, text)


def _package_of(stage: Stage) -> str:
    return RULES[stage].removeprefix("data.").rsplit(".", 1)[0]


def _closure(modules: Sequence[_Module], package: str) -> list[_Module]:
    """The modules of ``package`` and every module they may use, transitively."""
    reached = [module for module in modules if module.package == package]
    queue = list(reached)
    while queue:
        module = queue.pop()
        for other in modules:
            if other not in reached and _refers(module.references, other.package):
                reached.append(other)
                queue.append(other)
    return reached


def _refers(references: Iterable[str], package: str) -> bool:
    """Whether a reference names ``package``, a rule in it, or a document above it (``""``: ``data`` itself)."""
    return any(path == package or path.startswith(package + ".") or package.startswith(path + ".") or not path
               for path in references)


def _members(modules: Sequence[_Module]) -> frozenset[str]:
    return frozenset(member for member in ALL_MEMBERS
                     if any(re.search(rf"\b{member}\b", module.text) for module in modules))
