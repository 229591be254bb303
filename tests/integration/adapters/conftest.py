"""Real sidecars for the adapter tests: the test tools, the approval service, and clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.pipeline import Pipeline
from sidecar.server import Sidecar, create_server
from sidecar.tools.registry import Registry
from tests.support import tools

Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve(make_settings: Callable[..., Settings]) -> AsyncIterator[Serve]:
    """``await serve(**sections)``: start a sidecar of ``make_settings(**sections)`` serving
    ``tests.support.tools.ALL`` and the approval service; its Unix socket target. Stopped at teardown."""
    started: list[tuple[Sidecar, Pipeline]] = []

    async def start(**sections: Any) -> str:
        settings = make_settings(**sections)
        pipeline = await open_pipeline(settings, registry=Registry.from_tools(tools.ALL))
        _, sidecar = await create_server(settings, pipeline, approvals=pipeline.approvals)
        started.append((sidecar, pipeline))
        await sidecar.start()
        return sidecar.addresses[0]

    yield start
    for sidecar, pipeline in started:
        await sidecar.stop(None)
        await pipeline.aclose()


@pytest.fixture
async def client(serve: Serve) -> AsyncIterator[AsyncClient]:
    """A client of a sidecar in dev mode (the principal ``dev``) with the default policies."""
    async with AsyncClient(await serve(), timeout=30) as client:
        yield client
