"""The sidecars the suite starts from installed plugins serve the bundled ones and only them: a plugin installed
besides them (``pip install -e examples/demo_tools``, as docs/agents.md says) changes no test's tools."""

from __future__ import annotations

from pathlib import Path

from sidecar.config import load_settings
from sidecar.tools.registry import Registry
from tests.support.cli import write_config
from tests.support.installed import BUNDLED_PLUGINS, ONLY_BUNDLED, install, site

__all__ = ["site"]  # the fixture

EXTRA = '''
from pydantic import BaseModel
from sidecar.plugin import SideEffect, ToolContext, tool

class In(BaseModel):
    text: str = ""

@tool(name="extra_tool", version="1.0.0", side_effect=SideEffect.NONE)
async def extra_tool(args: In, ctx: ToolContext) -> In:
    return args

TOOLS = [extra_tool]
'''


def loaded(registry: Registry) -> list[str]:
    return sorted(plugin.entry_point for plugin in registry.plugins)


def test_a_plugin_installed_besides_the_bundled_ones_is_served_by_no_test_sidecar(site: Path, tmp_path: Path) -> None:
    install(site, "tb-extra", "tb_extra", {"extra": "tb_extra:TOOLS"}, EXTRA)
    assert "extra" in loaded(Registry.from_entry_points())  # installed: a sidecar that loads all would serve it
    configured = load_settings(write_config(tmp_path), env={})  # the config of the CLI tests' sidecars
    by_variable = load_settings(None, env=ONLY_BUNDLED)  # the README's reader, and serve with no flags
    for settings in (configured, by_variable):
        assert loaded(Registry.for_settings(settings)) == sorted(BUNDLED_PLUGINS)
