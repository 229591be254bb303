"""The shape of the code, checked: curated ``__all__`` everywhere, no import cycles, small modules.

Imports are read from the source (``ast``), including imports inside functions and under
``TYPE_CHECKING``, so a cycle cannot hide behind a lazy import. ``from package import name`` counts
as an import of ``package.name`` when that is a module, else of ``package``; a package's
``__init__`` is not imported by importing one of its submodules.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import sidecar

ROOT = Path(sidecar.__file__).parent
GENERATED = ROOT / "api" / "toolbooth"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()
PUBLIC = sorted(name for name in MODULES if not any(part.startswith("_") for part in name.split(".")[1:]))


def _imports(name: str, path: Path) -> Iterator[str]:
    """The sidecar modules ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in MODULES:
                    yield target
                elif base in MODULES:
                    yield base


GRAPH = {name: sorted(set(_imports(name, path)) - {name}) for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    """One import cycle among sidecar's modules, if there is any."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in GRAPH[module]:
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in GRAPH:
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycles_lazy_or_not() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_module_has_a_curated_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__ list"
    assert len(set(exported)) == len(exported), f"{name}.__all__ lists a name twice"
    missing = [item for item in exported if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_400_lines(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


# Who may import whom: each package lists the packages above it, which it must never import.
LAYERS = {
    # The metric families: counted into by the parts of every layer, so they import none of them.
    "sidecar.metrics": ("sidecar.tools", "sidecar.pipeline", "sidecar.policy", "sidecar.state", "sidecar.server",
                        "sidecar.cli", "sidecar.client", "sidecar.bootstrap", "sidecar.config", "sidecar.mcp"),
    "sidecar.tools": ("sidecar.pipeline", "sidecar.policy", "sidecar.state", "sidecar.server", "sidecar.cli"),
    "sidecar.policy": ("sidecar.pipeline", "sidecar.state", "sidecar.server", "sidecar.cli", "sidecar.client"),
    "sidecar.state": ("sidecar.pipeline", "sidecar.policy", "sidecar.server", "sidecar.cli", "sidecar.client"),
    "sidecar.pipeline": ("sidecar.server", "sidecar.cli", "sidecar.client", "sidecar.bootstrap"),
    "sidecar.server": ("sidecar.cli", "sidecar.client"),
    # MCP is a protocol adapter over whatever reaches the pipeline (the pipeline in the server, a client in the CLI).
    "sidecar.mcp": ("sidecar.pipeline", "sidecar.policy", "sidecar.state", "sidecar.tools", "sidecar.server",
                    "sidecar.cli", "sidecar.client", "sidecar.bootstrap", "sidecar.config"),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(name: str) -> None:
    above = next((banned for package, banned in LAYERS.items() if name == package or name.startswith(package + ".")),
                 ())
    wrong = [target for target in GRAPH[name] if any(target == b or target.startswith(b + ".") for b in above)]
    assert not wrong, f"{name} imports {wrong}"


INTEGRATIONS = sorted(name for name in MODULES if name.startswith("sidecar.integrations"))


@pytest.mark.parametrize("name", ["sidecar.client", *INTEGRATIONS])
def test_the_client_and_the_framework_adapters_need_nothing_from_the_server_side(name: str) -> None:
    """The adapters are a thin layer over the client: what they reach, even indirectly, is client-side."""
    reached, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += GRAPH[module]
    server_side = sorted(m for m in reached if m.split(".")[1] in {"server", "pipeline", "policy", "state", "cli",
                                                                    "bootstrap", "tools"})
    assert not server_side, f"{name} imports {server_side}"


@pytest.mark.parametrize("name", sorted(set(MODULES) - set(INTEGRATIONS)))
def test_nothing_but_an_adapter_imports_the_adapters(name: str) -> None:
    """The adapters need optional extras: the rest of the sidecar must import without them."""
    wrong = [target for target in GRAPH[name] if target.startswith("sidecar.integrations")]
    assert not wrong, f"{name} imports {wrong}"


def test_the_graph_sees_lazy_imports() -> None:
    """The cycle check is only as good as the graph: a function-level import is an edge too."""
    assert "sidecar.bootstrap" in GRAPH["sidecar.server.app"]
