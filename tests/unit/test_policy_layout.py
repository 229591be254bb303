"""The shape of ``sidecar.policy``: what it may import, no import cycles inside it, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sidecar" / "policy"
FORBIDDEN = ("sidecar.pipeline", "sidecar.server", "sidecar.cli", "sidecar.state", "sidecar.client")
MODULES = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
           for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """Every ``sidecar`` module ``path`` imports, at any level (``TYPE_CHECKING`` and functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(full if (full := f"{node.module}.{alias.name}") in MODULES else node.module
                         for alias in node.names)
    return {name for name in found if name == "sidecar" or name.startswith("sidecar.")}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_policy_modules_import_nothing_above_them(module: str) -> None:
    assert not [name for name in imports(MODULES[module]) if name.startswith(FORBIDDEN)]


def test_no_import_cycles_inside_the_policy_package() -> None:
    graph = {module: {name for name in imports(path) if name in MODULES and name != module}
             for module, path in MODULES.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module not in done:
            for name in graph[module]:
                visit(name, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_policy_modules_stay_small(module: str) -> None:
    assert len(MODULES[module].read_text().splitlines()) <= 400
