"""Tool discovery from the ``toolbooth.tools`` entry-point group.

An entry point names a ``Plugin`` (its tools and settings model, ``sidecar.tools.plugins``), a
``ToolDefinition`` or a list of them::

    [project.entry-points."toolbooth.tools"]
    calculator = "toolbooth_calculator:TOOLS"

Discovery happens only when ``Registry.from_entry_points`` is called, never at
import. A plugin that fails to import, an entry point that names something other
than tools, and two tools with one name stop start-up with ``PluginLoadError``
naming the entry points and distributions involved; an entry of ``plugins.allow`` that
names no installed plugin is a ``ConfigError`` naming it (a typo would otherwise start a
sidecar without tools). Each plugin's section of ``plugins.config`` (by entry-point name) is validated
against its settings model and bound to its tools; a section naming no loaded plugin, one for a plugin
without a settings model and a wrong key are a ``ConfigError`` naming ``plugins.config.<name>...``.
``Registry.plugins`` says what was loaded, for the start-up log.
``Registry.from_tools`` is the test seam.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from sidecar.config.settings import Origins, Settings
from sidecar.contract import ToolDescriptor
from sidecar.errors import ConfigError, PluginLoadError
from sidecar.tools.definition import ToolDefinition
from sidecar.tools.plugins import Plugin

__all__ = ["GROUP", "PluginInfo", "Registry", "describe"]

GROUP = "toolbooth.tools"



@dataclass(frozen=True, slots=True)
class _Origin:
    entry_point: str
    distribution: str

    def __str__(self) -> str:
        return f"entry point {self.entry_point!r} of distribution {self.distribution!r}"


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One loaded plugin: its entry point, the distribution that installed it, its version, its tools."""

    entry_point: str
    distribution: str
    version: str
    tools: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.entry_point} ({self.distribution} {self.version}: {', '.join(self.tools)})"


class Registry:
    """The tools this sidecar can dispatch to, by name."""

    def __init__(self, tools: dict[str, ToolDefinition[Any, Any]], plugins: Iterable[PluginInfo] = ()) -> None:
        self._tools = dict(sorted(tools.items()))
        self.plugins = tuple(plugins)  # empty for a registry built from_tools
        self._descriptors = {name: describe(defn) for name, defn in self._tools.items()}

    @classmethod
    def from_tools(cls, tools: Iterable[ToolDefinition[Any, Any]]) -> Registry:
        """Build a registry from explicit definitions; duplicate names are an error."""
        found: dict[str, ToolDefinition[Any, Any]] = {}
        for defn in tools:
            if defn.name in found:
                raise PluginLoadError(f"duplicate tool name {defn.name!r} (plugins {found[defn.name].plugin!r} "
                                      f"and {defn.plugin!r})")
            found[defn.name] = defn
        return cls(found)

    @classmethod
    def for_settings(cls, settings: Settings) -> Registry:
        """The installed plugins ``plugins.allow`` lets load, configured by ``plugins.config``."""
        return cls.from_entry_points(allow=settings.plugins.allow, config=settings.plugins.config,
                                     origins=settings.origins)

    @classmethod
    def from_entry_points(cls, *, group: str = GROUP, allow: Iterable[str] | None = None,
                          config: Mapping[str, Mapping[str, Any]] | None = None,
                          origins: Origins | None = None) -> Registry:
        """Load every installed plugin (or only those ``allow`` names by entry point or distribution), each
        configured with its section of ``config`` (``plugins.config``; ``origins``: the variables that set it).

        An ``allow`` entry that matches no installed plugin is a ``ConfigError`` at ``plugins.allow``; a
        ``config`` section that names no loaded plugin, or a wrong one, at ``plugins.config``.
        """
        installed = sorted(entry_points(group=group), key=lambda e: e.name)
        sources = [(ep, _Origin(ep.name, ep.dist.name if ep.dist else "?")) for ep in installed]
        if allow is not None:
            _check_allowed(tuple(allow), [origin for _, origin in sources])
            allowed = set(allow)
            sources = [(ep, o) for ep, o in sources if allowed & {o.entry_point, o.distribution}]
        config = dict(config or {})
        _check_configured(config, [origin for _, origin in sources])
        found: dict[str, tuple[ToolDefinition[Any, Any], _Origin]] = {}
        plugins: list[PluginInfo] = []
        for ep, origin in sources:
            defns = _load(ep, origin).configure(ep.name, config.get(ep.name), origins)
            for defn in defns:
                if defn.name in found:
                    raise PluginLoadError(f"duplicate tool name {defn.name!r}: defined by {found[defn.name][1]} "
                                          f"and by {origin}")
                found[defn.name] = (defn, origin)
            version = ep.dist.version if ep.dist else "?"
            plugins.append(PluginInfo(origin.entry_point, origin.distribution, version, tuple(d.name for d in defns)))
        return cls({name: defn for name, (defn, _) in found.items()}, plugins)

    def get(self, name: str) -> ToolDefinition[Any, Any] | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def descriptor(self, name: str) -> ToolDescriptor:
        """What discovery shows about tool ``name`` (precomputed)."""
        return self._descriptors[name]

    def __iter__(self) -> Iterator[ToolDefinition[Any, Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def describe(defn: ToolDefinition[Any, Any]) -> ToolDescriptor:
    """The descriptor of a definition; its schemas come from its input model (as validated) and its output
    model (as ``data`` is written: the serialization schema)."""
    return ToolDescriptor(
        name=defn.name,
        version=defn.version,
        description=defn.description,
        input_schema=defn.input_model.model_json_schema(),
        side_effect=defn.side_effect,
        requires_idempotency_key=defn.requires_idempotency_key,
        timeout_ms=round(defn.timeout * 1000),
        output_schema=defn.output_model.model_json_schema(mode="serialization"),
        title=defn.title,
    )


def _check_allowed(allow: tuple[str, ...], installed: list[_Origin]) -> None:
    """Every ``allow`` entry names an installed entry point or distribution."""
    names = {name for origin in installed for name in (origin.entry_point, origin.distribution)}
    unknown = [entry for entry in allow if entry not in names]
    if unknown:
        listed = ", ".join(f"{o.entry_point} (distribution {o.distribution})" for o in installed) or "none"
        raise ConfigError(f"config error at plugins.allow: {', '.join(map(repr, unknown))} "
                          f"{'matches' if len(unknown) == 1 else 'match'} no installed plugin; "
                          f"installed {GROUP} entry points: {listed}")


def _check_configured(config: Mapping[str, object], loaded: list[_Origin]) -> None:
    """Every section of ``plugins.config`` names a plugin that loads (by entry-point name)."""
    names = {origin.entry_point for origin in loaded}
    unknown = sorted(name for name in config if name not in names)
    if unknown:
        listed = ", ".join(sorted(names)) or "none"
        raise ConfigError("\n".join(f"config error at plugins.config.{name}: no plugin {name!r} is loaded "
                                     f"(sections are named by {GROUP} entry point; loaded: {listed})"
                                     for name in unknown))


def _load(ep: EntryPoint, origin: _Origin) -> Plugin:
    try:
        loaded = ep.load()
    except Exception as exc:  # any import failure of a plugin stops start-up, with its cause
        raise PluginLoadError(f"cannot load {origin} ({ep.value}): {type(exc).__name__}: {exc}") from exc
    if isinstance(loaded, Plugin):
        return loaded
    items = loaded if isinstance(loaded, list | tuple) else [loaded]
    if not items or not all(isinstance(item, ToolDefinition) for item in items):
        raise PluginLoadError(f"{origin} ({ep.value}) must name a Plugin, a tool defined with @tool or a list of "
                              f"them, got {type(loaded).__name__}")
    return Plugin(items)
