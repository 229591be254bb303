"""``Serving``: what ``toolbooth serve`` runs, as the composition root opened it (``sidecar.bootstrap``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.pipeline.gate import Pipeline
    from sidecar.policy.reload import ReloadingEngine
    from sidecar.server.endpoints import Endpoints
    from sidecar.state.checkpoint import Checkpointer

__all__ = ["Serving"]


@dataclass(frozen=True)
class Serving:
    """The engine, the pipeline, its endpoints and the checkpoint's writer (``None``: no chain key, or not this
    worker's job), run by ``sidecar.server.app.run``."""

    reloader: ReloadingEngine
    pipeline: Pipeline
    endpoints: Endpoints
    checkpointer: Checkpointer | None

    async def aclose(self) -> None:
        """Close the pipeline; with a checkpointer, once the last calls are recorded, so the checkpoint covers them."""
        if self.checkpointer is not None:
            await self.pipeline.drain()
            await self.checkpointer.try_write()
        await self.pipeline.aclose()
