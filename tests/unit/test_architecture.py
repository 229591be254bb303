"""The shape of the code, checked: curated ``__all__`` everywhere, no import cycles, small modules, layers.

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


def unit(name: str) -> str:
    """The package or top-level module a module belongs to: what ``LAYERS`` has a rule for."""
    return ".".join(name.split(".")[:2])


# The foundation: modules that import only one another, which every layer of the sidecar's side may use.
BASE = ("sidecar", "sidecar.contract", "sidecar.errors", "sidecar.faults", "sidecar.canonical", "sidecar.display",
        "sidecar.ids")
# Who may import whom: each package or top-level module lists those it may import besides its own modules; any
# other import is against the layering (docs/architecture.md: contract and errors at the bottom, then config,
# tools, policy and state, telemetry, the pipeline, the server, bootstrap (the composition root), the CLI on top;
# the client, its adapters and MCP apart, over api and contract).
LAYERS: dict[str, tuple[str, ...]] = {
    "sidecar": (),  # the version, and the names of the public modules
    "sidecar.contract": (),
    "sidecar.canonical": (),
    "sidecar.display": (),
    "sidecar.ids": (),
    "sidecar.client_tls": (),
    # The metric families: counted into by the parts of every layer, so they import none of them.
    "sidecar.metrics": (),
    "sidecar.errors": ("sidecar.contract",),
    "sidecar.faults": ("sidecar.contract", "sidecar.errors"),
    "sidecar.downloads": ("sidecar",),  # its user agent names the version
    "sidecar.api": ("sidecar.contract",),
    "sidecar.config": ("sidecar.contract", "sidecar.errors"),
    "sidecar.tools": (*BASE, "sidecar.config"),
    "sidecar.policy": (*BASE, "sidecar.config", "sidecar.downloads", "sidecar.metrics", "sidecar.tools"),
    "sidecar.state": (*BASE, "sidecar.config", "sidecar.metrics"),
    "sidecar.telemetry": BASE,
    "sidecar.pipeline": (*BASE, "sidecar.config", "sidecar.metrics", "sidecar.policy", "sidecar.state",
                         "sidecar.telemetry", "sidecar.tools"),
    # The composition root: it knows every part, the server too, and only the CLI knows it.
    "sidecar.bootstrap": (*BASE, "sidecar.config", "sidecar.metrics", "sidecar.pipeline", "sidecar.policy",
                          "sidecar.server", "sidecar.state", "sidecar.telemetry", "sidecar.tools"),
    "sidecar.server": (*BASE, "sidecar.api", "sidecar.config", "sidecar.downloads", "sidecar.mcp",
                       "sidecar.metrics", "sidecar.pipeline", "sidecar.policy", "sidecar.state", "sidecar.telemetry",
                       "sidecar.tools"),
    "sidecar.cli": (*BASE, "sidecar.api", "sidecar.bootstrap", "sidecar.client", "sidecar.client_tls",
                    "sidecar.config", "sidecar.mcp", "sidecar.pipeline", "sidecar.policy", "sidecar.server",
                    "sidecar.state", "sidecar.telemetry", "sidecar.tools"),
    "sidecar.__main__": ("sidecar.cli",),
    # The client side needs nothing of the server's: the client is api, contract and its TLS channel.
    "sidecar.client": ("sidecar.api", "sidecar.client_tls", "sidecar.contract"),
    "sidecar.integrations": ("sidecar.client", "sidecar.contract"),
    # MCP is a protocol adapter over whatever reaches the pipeline (the pipeline in the server, a client in the CLI).
    "sidecar.mcp": ("sidecar", "sidecar.api", "sidecar.contract", "sidecar.errors", "sidecar.faults"),
    # The faces for plugin authors: over the tools (and config's state directory), and over the CLI's helpers. Its
    # test kit (sidecar.plugin.testing) opens the sidecar's own pipeline through the composition root, as the CLI does.
    "sidecar.plugin": ("sidecar.bootstrap", "sidecar.config", "sidecar.contract", "sidecar.errors", "sidecar.pipeline",
                       "sidecar.state", "sidecar.tools"),
    "sidecar.plugin_cli": ("sidecar.cli",),
    "sidecar.masking": ("sidecar.tools",),  # where plugins written before sidecar.plugin import SENSITIVE from
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_against_the_layering(name: str) -> None:
    allowed = {unit(name), *LAYERS.get(unit(name), ())}
    wrong = [target for target in GRAPH[name] if unit(target) not in allowed]
    assert not wrong, f"{name} imports {wrong}, not in LAYERS[{unit(name)!r}]"


def test_every_module_falls_under_a_layer() -> None:
    """A new package or top-level module gets its rule when it is added, not after an import went wrong."""
    missing = sorted({unit(name) for name in MODULES} - set(LAYERS))
    assert not missing, f"no rule in LAYERS for {missing}"
    unknown = sorted({target for allowed in LAYERS.values() for target in allowed} - set(LAYERS))
    assert not unknown, f"LAYERS allows what has no rule of its own: {unknown}"


def test_the_rules_keep_what_the_architecture_promises() -> None:
    """What docs/architecture.md says of the layers, so that a rule is not widened past it unnoticed."""
    assert not any("sidecar.pipeline" in LAYERS[part] for part in ("sidecar.tools", "sidecar.policy", "sidecar.state"))
    assert not {"sidecar.api", "sidecar.server", "sidecar.cli"} & set(LAYERS["sidecar.pipeline"])  # no gRPC
    assert [part for part, allowed in LAYERS.items() if "sidecar.bootstrap" in allowed] == ["sidecar.cli",
                                                                                          "sidecar.plugin"]
    assert set(LAYERS["sidecar.mcp"]) <= {"sidecar", "sidecar.api", "sidecar.contract", "sidecar.errors",
                                          "sidecar.faults"}
    assert LAYERS["sidecar.metrics"] == ()


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
    assert "sidecar.server.app" in GRAPH["sidecar.bootstrap"]  # imported inside ``serve``
