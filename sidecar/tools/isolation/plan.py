"""Which tools run isolated, in the worker processes of which plugin: ``isolation`` checked against the tools.

A plugin is named as in ``plugins.allow``: by its entry point or its distribution; a tool given to
the registry directly (``Registry.from_tools``: tests, embedding) belongs to the plugin named by its
module (``ToolDefinition.plugin``). Listing a plugin isolates its sync tools (its async ones run as
before: they are cancelled at their deadline); listing a tool isolates that tool. Every entry that
names nothing loaded, an async tool, a plugin without a sync tool, and a handler a worker could
not import by its path is an error; all of them are in one ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.config import IsolationSettings
from sidecar.errors import ConfigError
from sidecar.tools.definition import ToolDefinition
from sidecar.tools.isolation.paths import HandlerPath, handler_path
from sidecar.tools.registry import Registry

__all__ = ["IsolationPlan", "isolation_plan"]


@dataclass(frozen=True)
class IsolationPlan:
    """The isolated tools' handler paths, by plugin (the name of its worker pool) and tool."""

    plugins: Mapping[str, Mapping[str, HandlerPath]]

    def describe(self) -> str:
        """For people, on one line."""
        return "; ".join(f"{plugin} ({', '.join(tools)})" for plugin, tools in self.plugins.items()) or "none"


def isolation_plan(registry: Registry, settings: IsolationSettings) -> IsolationPlan:
    """The plan for ``registry``'s tools; ``ConfigError`` naming every entry of ``settings`` that is wrong."""
    names = _plugin_names(registry)
    problems: list[str] = []
    chosen: dict[str, ToolDefinition[Any, Any]] = {}
    for entry in settings.plugins:
        tools = [defn for defn in registry if entry in names[defn.name]]
        sync = [defn for defn in tools if not defn.is_async]
        if not tools:
            loaded = sorted({" / ".join(dict.fromkeys(found)) for found in names.values()})
            problems.append(f"at isolation.plugins: {entry!r} matches no loaded plugin; loaded: "
                            f"{', '.join(loaded) or 'none'}")
        elif not sync:
            problems.append(f"at isolation.plugins: plugin {entry!r} has no sync tool to isolate (async: "
                            f"{', '.join(defn.name for defn in tools)}; they are cancelled at their deadline)")
        chosen.update((defn.name, defn) for defn in sync)
    for name in settings.tools:
        found = registry.get(name)
        if found is None:
            problems.append(f"at isolation.tools: {name!r} is no loaded tool; loaded: "
                            f"{', '.join(defn.name for defn in registry) or 'none'}")
        elif found.is_async:
            problems.append(f"at isolation.tools: tool {name!r} has an async handler; only sync handlers run in "
                            "worker processes (an async one is cancelled at its deadline)")
        else:
            chosen[name] = found
    plugins: dict[str, dict[str, HandlerPath]] = {}
    for name, defn in sorted(chosen.items()):
        try:
            path = handler_path(defn)
        except ValueError as exc:
            problems.append(f"at isolation: tool {name!r} cannot be isolated: {exc}")
            continue
        plugins.setdefault(names[name][0], {})[name] = path
    if problems:
        raise ConfigError("\n".join(f"config error {problem}" for problem in problems))
    return IsolationPlan(dict(sorted(plugins.items())))


def _plugin_names(registry: Registry) -> dict[str, tuple[str, ...]]:
    """For each tool, the names of its plugin: the pool's name first."""
    names: dict[str, tuple[str, ...]] = {defn.name: (defn.plugin,) for defn in registry}
    for plugin in registry.plugins:
        names.update((tool, (plugin.entry_point, plugin.distribution)) for tool in plugin.tools)
    return names
