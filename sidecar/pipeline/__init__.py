"""One call through every stage, with no transport code (stages 0-10 of ``sidecar.pipeline.order``;
``docs/architecture.md``).

``Pipeline`` (``gate``) is what transports call; a call is a ``Call`` (``call``) run through a
``Chain`` (``chain``) of stages (``stages/``), built by ``sidecar.bootstrap``. Approvals and the
lookup of keyed operations are the pipeline's services (``approvals``, ``operations``).
"""

from __future__ import annotations

from sidecar.pipeline.gate import Pipeline

__all__ = ["Pipeline"]
