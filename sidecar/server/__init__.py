"""The gRPC transport of the sidecar: ``create_server`` for tests and embedding (``sidecar.bootstrap.serve`` runs
the whole sidecar).

The server modules load on first use, so ``sidecar.client`` (which needs only
``sidecar.api.convert``) does not import the pipeline, JWT or YAML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sidecar.server.app import Sidecar, create_server

__all__ = ["Sidecar", "create_server"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sidecar.server import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
