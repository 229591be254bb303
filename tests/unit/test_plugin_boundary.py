"""Plugins and examples import only the public face (``sidecar.PUBLIC_MODULES``), read from their source (``ast``).

A plugin (a directory of ``plugins/`` or ``examples/`` with its own ``pyproject.toml``) imports ``sidecar.plugin``,
``sidecar.plugin_cli`` for its own command-line program, and ``sidecar.client``; an example program any public
module. Imports inside functions count; ``from sidecar import plugin`` is an import of ``sidecar.plugin``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import sidecar
from sidecar import PUBLIC_MODULES

REPO = Path(sidecar.__file__).resolve().parent.parent
PLUGIN_FACE = ("sidecar.plugin", "sidecar.plugin_cli", "sidecar.client")
# What a plugin's tests reach besides the public face: a real sidecar to run the plugin's tools through (the
# composition root, the pipeline, the gRPC server, the registry of entry points, the toolbooth command) and
# the strict-schema check its tool schemas must pass. Allowed until a test kit offers them publicly.
TEST_HARNESS = ("sidecar.bootstrap", "sidecar.pipeline", "sidecar.server", "sidecar.tools.registry", "sidecar.cli",
                "sidecar.api.strict")
SOURCES = sorted(path for folder in ("plugins", "examples") for path in (REPO / folder).rglob("*.py"))


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def sidecar_imports(source: str, where: str) -> Iterator[tuple[int, str]]:
    """The line and the sidecar module of each import in ``source``."""
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "sidecar")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "sidecar":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield node.lineno, submodule if _is_module(submodule) else str(node.module)


def _allowed(path: Path) -> tuple[str, ...]:
    relative = path.relative_to(REPO)
    if "tests" in relative.parts:
        return (*PUBLIC_MODULES, *TEST_HARNESS)
    in_a_plugin = any((REPO / Path(*relative.parts[:depth]) / "pyproject.toml").is_file()
                      for depth in range(2, len(relative.parts)))
    return PLUGIN_FACE if in_a_plugin else PUBLIC_MODULES


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(REPO)))
def test_plugins_and_examples_import_only_the_public_face(path: Path) -> None:
    allowed = _allowed(path)
    wrong = [f"{path.relative_to(REPO)}:{line} imports {name}"
             for line, name in sidecar_imports(path.read_text(), str(path)) if name not in allowed]
    assert not wrong, "\n".join(wrong) + f"\n(allowed here: {', '.join(allowed)})"


def test_the_boundary_knows_a_plugin_from_an_example() -> None:
    calculator = REPO / "plugins" / "calculator" / "toolbooth_calculator" / "__init__.py"
    assert _allowed(calculator) == PLUGIN_FACE
    assert _allowed(REPO / "examples" / "demo_tools" / "toolbooth_demo_tools" / "__init__.py") == PLUGIN_FACE
    assert _allowed(REPO / "examples" / "agent_loop.py") == PUBLIC_MODULES
    assert ("sidecar.plugin", "sidecar.config") == tuple(
        name for _, name in sidecar_imports("def f():\n from sidecar import plugin\n import sidecar.config\n", "t"))
