"""A real sidecar with its HTTP/JSON endpoint, for the endpoint's tests: gRPC and HTTP/JSON over one pipeline."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from sidecar.bootstrap import assemble
from sidecar.config import Limits, Settings
from sidecar.pipeline import Pipeline
from sidecar.server import Sidecar, create_server
from sidecar.server.http_json import HttpJsonEndpoint
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.approvals import policies

__all__ = ["Served", "serving_http_json"]


@dataclass(frozen=True)
class Served:
    endpoint: HttpJsonEndpoint
    target: str  # the gRPC address of the same sidecar
    pipeline: Pipeline


@contextlib.asynccontextmanager
async def serving_http_json(settings: Settings, tmp_path: Path) -> AsyncIterator[Served]:
    """The test tools (``held_note`` too) behind gRPC and HTTP/JSON (``settings.http_json``), on a fresh SQLite
    store, with the approval policies of ``tests.support.approvals``; stopped after, nothing left held."""
    store = await SqliteStore.open(tmp_path / "store.db")
    registry = Registry.from_tools([*tools.ALL, tools.held_note])
    pipeline = assemble(registry=registry, policy=policies(tmp_path / "policies"), store=store, limits=Limits())
    sidecar: Sidecar | None = None
    endpoint = HttpJsonEndpoint.open(settings, pipeline)
    try:
        _, sidecar = await create_server(settings, pipeline, approvals=pipeline.approvals)
        await sidecar.start()
        await endpoint.start()
        yield Served(endpoint, sidecar.addresses[-1], pipeline)
    finally:
        tools.HOLD.open()  # nothing may stay held past the test
        await endpoint.stop()
        tools.HOLD.close()
        if sidecar is not None:
            await sidecar.stop(None)
        await pipeline.aclose()
