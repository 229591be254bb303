"""The plugin author's one import: everything needed to write, type and test a tool.

A tool is a typed function::

    from sidecar.plugin import SENSITIVE, SideEffect, ToolContext, ToolError, tool

    @tool(name="calculate", version="1.0.0", side_effect=SideEffect.NONE, timeout=0.5)
    async def calculate(args: CalculateInput, ctx: ToolContext) -> CalculateOutput: ...

Its input and output are pydantic models; the JSON schema shown to the model comes from the
input model. A handler may also return ``Partial(output, errors=[ToolError(...)])`` when some parts
failed, and a tool may name a ``preview`` renderer whose rendering of a call its approver approves
(``docs/plugins.md``). A definition is checked when the decorator runs: a bad one raises
``ToolDefinitionError`` naming the plugin, the tool and the field. Decorating registers
nothing globally; a plugin exposes its tools through the ``toolbooth.tools`` entry-point
group (``docs/plugins.md``), naming a list of them or a ``Plugin(tools, settings=Model)``: the
operator's ``plugins.config.<name>`` section, validated as ``Model`` at start-up, reaches each call
as ``ctx.plugin_settings(Model)``; ``read_plugin_settings`` reads it for the plugin's own programs (a
``ConfigError`` says what is wrong), and ``default_state_dir`` is where Toolbooth keeps its files by default.
A plugin's own command-line program takes its flags, tables and progress from ``sidecar.plugin_cli``.

This module is a promise to plugin authors: the names in ``__all__`` keep their meaning.
(``sidecar.contract`` and ``sidecar.masking``, which older plugins import from, keep theirs too.)
"""

from __future__ import annotations

from sidecar.config import default_state_dir
from sidecar.contract import ErrorCode, Principal, Recovery, SideEffect
from sidecar.errors import ConfigError
from sidecar.tools.definition import RetryPolicy, ToolContext, ToolDefinition, ToolDefinitionError, tool
from sidecar.tools.masking import SENSITIVE
from sidecar.tools.outcomes import Partial, ToolError
from sidecar.tools.plugins import Plugin, PluginDefinitionError, read_plugin_settings

__all__ = [
    "SENSITIVE",
    "ConfigError",
    "ErrorCode",
    "Partial",
    "Plugin",
    "PluginDefinitionError",
    "Principal",
    "Recovery",
    "RetryPolicy",
    "SideEffect",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolError",
    "default_state_dir",
    "read_plugin_settings",
    "tool",
]
