"""A real sidecar in JWT mode over the bundled policies, for tests that need more than one principal.

``async with gated(tools, settings, tokens, store_path) as world`` assembles the pipeline over ``tools``
(an embedded engine, a SQLite store), serves it with the approval service on the settings' listeners,
and gives clients: ``world.client(sub, roles)`` connects with a token of that principal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.bootstrap import assemble
from sidecar.client import AsyncClient
from sidecar.config import Limits, Settings, bundled_policy_dir
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.server import create_server
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.definition import ToolDefinition
from sidecar.tools.registry import Registry

__all__ = ["World", "gated"]


@dataclass
class World:
    """One served sidecar: its target, its store, its policy revision, and clients with tokens of any principal."""

    target: str
    tokens: Callable[..., str]
    store: SqliteStore
    revision: str
    clients: list[AsyncClient] = field(default_factory=list)

    def client(self, sub: str = "alice", roles: Sequence[str] = ("developer",), tenant: str = "acme") -> AsyncClient:
        client = AsyncClient(self.target, token=self.tokens(sub=sub, roles=list(roles), tenant=tenant))
        self.clients.append(client)
        return client

    @property
    def agent(self) -> AsyncClient:
        return self.client()

    @property
    def approver(self) -> AsyncClient:
        return self.client("bob", ("approver",))


@asynccontextmanager
async def gated(tools: Sequence[ToolDefinition[Any, Any]], settings: Settings, tokens: Callable[..., str],
                store_path: Path, limits: Limits | None = None,
                engine: EmbeddedEngine | None = None) -> AsyncIterator[World]:
    """A started sidecar serving ``tools`` under ``engine``'s policies, else the bundled ones (with ``limits``);
    stopped when the block ends."""
    store, engine = await SqliteStore.open(store_path), engine or EmbeddedEngine.load(bundled_policy_dir())
    pipeline = assemble(registry=Registry.from_tools(list(tools)), policy=engine, store=store,
                        limits=limits or Limits())
    try:
        _, sidecar = await create_server(settings, pipeline, approvals=pipeline.approvals)
        await sidecar.start()
        world = World(sidecar.addresses[-1], tokens, store, engine.revision)
        try:
            yield world
        finally:
            await asyncio.gather(*(client.close() for client in world.clients))
            await sidecar.stop(None)
    finally:
        await pipeline.aclose()
