"""Toolbooth: a policy-as-code sidecar for AI-agent tool calls.

Public entry points: ``sidecar.plugin`` (writing tools), ``sidecar.client``
(calling the sidecar), ``sidecar.contract`` (result and error types) and the
``toolbooth`` command (``sidecar.cli``).
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("toolbooth")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
