"""Entry-point discovery against real distributions installed into a temporary path."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import PluginLoadError
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.installed import install, site

TOOL_MODULE = '''
from pydantic import BaseModel
from sidecar.plugin import SideEffect, ToolContext, tool

class In(BaseModel):
    x: int = 0

@tool(name="{name}", version="1.0.0", side_effect=SideEffect.NONE)
async def handler(args: In, ctx: ToolContext) -> In:
    return args

TOOLS = [handler]
NOT_A_TOOL = 42
'''

__all__ = ["site"]  # the fixture


def test_loads_lists_and_single_tools(site: Path) -> None:
    install(site, "tb-alpha", "tb_alpha", {"alpha": "tb_alpha:TOOLS"}, TOOL_MODULE.format(name="alpha_tool"))
    install(site, "tb-beta", "tb_beta", {"beta": "tb_beta:handler"}, TOOL_MODULE.format(name="beta_tool"))
    registry = Registry.from_entry_points()
    assert {"alpha_tool", "beta_tool"} <= {t.name for t in registry}
    assert registry.descriptor("alpha_tool").input_schema["properties"]["x"]["type"] == "integer"


def test_allow_list_by_entry_point_or_distribution(site: Path) -> None:
    install(site, "tb-alpha", "tb_alpha", {"alpha": "tb_alpha:TOOLS"}, TOOL_MODULE.format(name="alpha_tool"))
    install(site, "tb-beta", "tb_beta", {"beta": "tb_beta:TOOLS"}, TOOL_MODULE.format(name="beta_tool"))
    assert [t.name for t in Registry.from_entry_points(allow=["alpha"])] == ["alpha_tool"]
    assert [t.name for t in Registry.from_entry_points(allow=["tb-beta"])] == ["beta_tool"]
    assert len(Registry.from_entry_points(allow=[])) == 0


def test_import_failure_names_entry_point_and_distribution(site: Path) -> None:
    install(site, "tb-broken", "tb_broken", {"broken": "tb_broken:TOOLS"}, "import does_not_exist_anywhere\n")
    with pytest.raises(PluginLoadError) as info:
        Registry.from_entry_points(allow=["broken"])
    message = str(info.value)
    assert "entry point 'broken'" in message and "distribution 'tb-broken'" in message
    assert "does_not_exist_anywhere" in message


def test_entry_point_must_name_tools(site: Path) -> None:
    install(site, "tb-odd", "tb_odd", {"odd": "tb_odd:NOT_A_TOOL"}, TOOL_MODULE.format(name="odd_tool"))
    with pytest.raises(PluginLoadError, match=r"entry point 'odd' of distribution 'tb-odd'.*must name a Plugin"):
        Registry.from_entry_points(allow=["odd"])


def test_duplicate_names_stop_start_up_naming_both(site: Path) -> None:
    install(site, "tb-one", "tb_one", {"one": "tb_one:TOOLS"}, TOOL_MODULE.format(name="same_name"))
    install(site, "tb-two", "tb_two", {"two": "tb_two:TOOLS"}, TOOL_MODULE.format(name="same_name"))
    with pytest.raises(PluginLoadError) as info:
        Registry.from_entry_points(allow=["one", "two"])
    message = str(info.value)
    assert "duplicate tool name 'same_name'" in message
    assert "'tb-one'" in message and "'tb-two'" in message


def test_installed_calculator_plugin_is_discovered() -> None:
    registry = Registry.from_entry_points(allow=["calculator"])
    calculate = registry.get("calculate")
    assert calculate is not None and calculate.plugin == "toolbooth_calculator"


def test_a_descriptor_has_the_output_schema_of_the_data_and_the_title() -> None:
    registry = Registry.from_tools(tools.ALL)
    echo = registry.descriptor("echo")
    assert echo.output_schema["properties"]["principal"]["type"] == "string"
    assert echo.output_schema["properties"]["attempt"]["default"] == 1
    assert echo.title == ""


def test_from_tools_rejects_duplicates() -> None:
    with pytest.raises(PluginLoadError, match="duplicate tool name 'echo'"):
        Registry.from_tools([tools.echo, tools.echo])
