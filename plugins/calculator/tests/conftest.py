"""The plugin test kit's fixtures (``sidecar.plugin.fixtures``): ``tool_context`` and ``toolbooth_gate``."""

from __future__ import annotations

from sidecar.plugin.fixtures import tool_context, toolbooth_gate

__all__ = ["tool_context", "toolbooth_gate"]
