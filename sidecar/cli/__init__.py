"""The ``toolbooth`` command, one module per command group; ``main`` is its entry point."""

from __future__ import annotations

from sidecar.cli.app import main

__all__ = ["main"]
