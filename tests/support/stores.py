"""Stores for tests: either backend for a test parametrized over both, and the real store with one behaviour of a
busy database added."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.config.store import StoreKind
from sidecar.state import KeyScope, Store
from sidecar.state.postgres import PostgresStore
from sidecar.state.sqlite import SqliteStore
from tests.support.waiting import past

__all__ = ["BACKENDS", "LateClaims", "open_store"]


BACKENDS = list(StoreKind)  # what a fixture over every backend is parametrized with (ids=str: "sqlite", ...)
_OPEN: dict[StoreKind, Callable[[pytest.FixtureRequest, Path], Awaitable[Store]]] = {
    StoreKind.SQLITE: lambda request, tmp_path: SqliteStore.open(tmp_path / "store.db"),
    StoreKind.POSTGRES: lambda request, tmp_path: PostgresStore.open(request.getfixturevalue("postgres_dsn")),
}


async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """The store of a fixture parametrized with ``BACKENDS``: a fresh SQLite file in ``tmp_path``, the test's
    PostgreSQL database (``postgres_dsn``), ... (a kind without a row here fails)."""
    return await _OPEN[request.param](request, tmp_path)


class LateClaims:
    """The store, but the claim of each key added to ``late`` (once each) first waits until the claimed call's
    deadline has passed, as a claim queued behind a busy database does, and until ``gate`` is set if a test set
    one (once its caller gave up: the caller's own deadline then certainly passed first). ``settled`` is set once a
    key is completed or released."""

    def __init__(self, inner: Store, late: set[str] | None = None) -> None:
        self.inner, self.late, self.settled = inner, set() if late is None else late, asyncio.Event()
        self.gate: asyncio.Event | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str, *,
                    deadline_at: float | None = None, legacy_hash: str | None = None) -> Any:
        if scope.key in self.late:
            self.late.discard(scope.key)
            assert deadline_at is not None
            if self.gate is not None:
                await self.gate.wait()
            await past(deadline_at)
        return await self.inner.claim(scope, request_hash, request_id, deadline_at=deadline_at,
                                      legacy_hash=legacy_hash)

    async def complete(self, scope: KeyScope, result_json: str, *, request_id: str) -> None:
        await self.inner.complete(scope, result_json, request_id=request_id)
        self.settled.set()

    async def release(self, scope: KeyScope, *, request_id: str) -> None:
        await self.inner.release(scope, request_id=request_id)
        self.settled.set()
