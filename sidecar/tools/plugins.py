"""A plugin's registration, ``Plugin``: its tools and the pydantic model of its settings.

An entry point of ``toolbooth.tools`` names a ``Plugin``, or (as before settings existed) a tool or a list
of tools. The operator configures a plugin under ``plugins.config.<entry point name>`` (or with
``TOOLBOOTH_PLUGINS__CONFIG__<NAME>__<KEY>``); ``Plugin.configure`` validates that section against the
model when the sidecar loads the plugin and binds the instance to each tool, whose handler and preview
renderer get it as ``ctx.settings`` (``ToolContext.plugin_settings(Model)`` returns it typed). A
model whose every field has a default makes the section optional; a missing or empty one is ``{}``.

``read_plugin_settings`` gives a plugin's own programs (an indexer, a migration) the same settings from
the same config file and variables, validated the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sidecar.config.settings import Origins, describe_errors, load_settings
from sidecar.errors import ConfigError
from sidecar.tools.definition import ToolDefinition

__all__ = ["Plugin", "PluginDefinitionError", "read_plugin_settings", "validate_plugin_settings"]

S = TypeVar("S", bound=BaseModel)


class PluginDefinitionError(ValueError):
    """A ``Plugin`` registration is invalid: no tools, something other than tools, or an unusable settings model."""


@dataclass(frozen=True, slots=True)
class Plugin:
    """The tools of one plugin and, optionally, the model of its settings (``settings=``).

    The model must forbid unknown keys (``model_config = ConfigDict(extra="forbid")``), so that a
    misspelt key is an error and not a default silently kept."""

    tools: tuple[ToolDefinition[Any, Any], ...]
    settings: type[BaseModel] | None = None

    def __init__(self, tools: Iterable[ToolDefinition[Any, Any]], *, settings: type[BaseModel] | None = None) -> None:
        listed = tuple(tools)
        if not listed or not all(isinstance(t, ToolDefinition) for t in listed):
            raise PluginDefinitionError("Plugin(tools=...) must be one or more tools defined with @tool")
        if settings is not None:
            if not (isinstance(settings, type) and issubclass(settings, BaseModel)):
                raise PluginDefinitionError(f"Plugin(settings=...) must be a pydantic model class, got {settings!r}")
            if settings.model_config.get("extra") != "forbid":
                raise PluginDefinitionError(f"the settings model {settings.__qualname__} must forbid unknown keys: "
                                            'model_config = ConfigDict(extra="forbid")')
        object.__setattr__(self, "tools", listed)
        object.__setattr__(self, "settings", settings)

    def configure(self, name: str, section: Mapping[str, Any] | None,
                  origins: Origins | None = None) -> tuple[ToolDefinition[Any, Any], ...]:
        """The tools bound to their settings, ``section`` (``None``: not configured) validated as the
        plugin ``name``'s; ``ConfigError`` naming each wrong key as ``plugins.config.<name>.<key>``."""
        if self.settings is None:
            if section is not None:
                raise ConfigError(f"config error at plugins.config.{name}: plugin {name!r} declares no settings "
                                  "(its entry point names tools, not a Plugin with settings=); remove this section")
            return self.tools
        bound = validate_plugin_settings(name, self.settings, section or {}, origins)
        return tuple(replace(defn, settings=bound) for defn in self.tools)


def validate_plugin_settings(name: str, model: type[S], section: Mapping[str, Any],
                             origins: Origins | None = None) -> S:
    """``section`` as an instance of ``model``; ``ConfigError`` at ``plugins.config.<name>.<key>`` (naming the
    ``TOOLBOOTH_*`` variable that set a wrong value, from ``origins``)."""
    try:
        return model.model_validate(section)
    except ValidationError as exc:
        raise describe_errors(exc, at=("plugins", "config", name), origins=origins) from None


def read_plugin_settings(name: str, model: type[S], config: Path | None = None,
                         env: Mapping[str, str] | None = None) -> S:
    """The settings of plugin ``name`` as the sidecar would give them: ``plugins.config.<name>`` of the
    config file ``config`` (optional) and the ``TOOLBOOTH_*`` variables of ``env`` (default ``os.environ``),
    validated as ``model``. The whole configuration must load; ``ConfigError`` names what is wrong."""
    settings = load_settings(config, env)
    return validate_plugin_settings(name, model, settings.plugins.config.get(name, {}), settings.origins)
