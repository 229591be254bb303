"""The ``toolbooth`` command, one module per command group; ``main`` is its entry point.

``root`` builds the parser from the groups (``serve``, ``tools``, ``config``, ``policy`` with
``bundle``, ``audit``, ``approvals``, ``operations``) and dispatches; ``common`` holds what they share, ``output``
the ``--output`` flag and JSON errors, ``table`` and ``progress`` what people see at a terminal.
"""

from __future__ import annotations

from sidecar.cli.root import main

__all__ = ["main"]
