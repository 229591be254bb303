"""``python -m sidecar``: the ``toolbooth`` command."""

from __future__ import annotations

from sidecar.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
