"""Toolbooth: a policy-as-code sidecar for AI-agent tool calls.

The public face is ``PUBLIC_MODULES`` and the ``toolbooth`` command: ``sidecar.plugin`` (writing tools, tested
with ``sidecar.plugin.testing`` and its pytest fixtures, ``sidecar.plugin.fixtures``; a plugin's own command-line
program takes its helpers from ``sidecar.plugin_cli``), ``sidecar.client``
(calling the sidecar), ``sidecar.contract`` (the result and error types both share), the framework
adapters of ``sidecar.integrations``, ``sidecar.config`` (the configuration the sidecar reads, for a
program that finds it with ``load_settings``) and ``sidecar.masking`` (kept for plugins written before
``sidecar.plugin``). Their ``__all__`` is what they promise. Every other module is internal: its names may
change in any release, and plugins and examples do not import it (``tests/unit/test_plugin_boundary.py``).
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["PUBLIC_MODULES", "__version__"]

PUBLIC_MODULES = (
    "sidecar.plugin",
    "sidecar.plugin.testing",
    "sidecar.plugin.fixtures",
    "sidecar.plugin_cli",
    "sidecar.client",
    "sidecar.contract",
    "sidecar.integrations",
    "sidecar.integrations.calls",
    "sidecar.integrations.openai_agents",
    "sidecar.integrations.pydantic_ai",
    "sidecar.config",
    "sidecar.masking",
)

try:
    __version__ = version("toolbooth")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
