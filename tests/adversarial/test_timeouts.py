"""Writes that outlive their deadline, through a real server (issue 8, defect 2).

- A sync write whose handler outlives its deadline may still have its effect: the caller gets
  ``TIMEOUT`` (``check_operation_status``), its key is ``unknown`` while the handler runs on (retries
  get ``OPERATION_IN_PROGRESS``, nothing runs twice), and when the handler ends its own result is
  stored and audited: ``GetOperation`` says ``completed`` and retries replay it.
- An operator can resolve such a key while it is unknown; the handler's late result never
  overwrites the resolution.
- An async write cancelled at its deadline stays ``unknown`` (never ``failed``) until resolved.

The first runs on SQLite and PostgreSQL, the others on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import assemble
from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.config import Limits, Settings, bundled_policy_dir
from sidecar.contract import ErrorCode, OperationState, Recovery, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.server import create_server
from sidecar.state import Store
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support.stores import BACKENDS, LateClaims, open_store
from tests.support.tools import Count, Text
from tests.support.waiting import until

__all__ = ["jwt_auth", "make_settings", "make_token", "postgres", "postgres_dsn", "rsa_key", "socket_path"]

pytestmark = pytest.mark.integration
WAIT = 10.0  # seconds: the deadline of every wait for an event
TIMEOUT = 0.3  # seconds: the tools' timeout


class Overrun:
    """Holds ``overrun_note``'s handler past its deadline until the test releases it; counts its starts
    and writes one marker line per effect."""

    def __init__(self, marker: Path) -> None:
        self.marker, self.started, self.release = marker, threading.Event(), threading.Event()
        self.starts = 0

    def effects(self) -> list[str]:
        return self.marker.read_text().splitlines() if self.marker.exists() else []


OVERRUN: list[Overrun] = []


@tool(name="overrun_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=TIMEOUT)
def overrun_note(args: Text, ctx: ToolContext) -> Count:
    """A sync write that sleeps past its timeout (until the test releases it), then writes its marker."""
    held = OVERRUN[-1]
    held.starts += 1
    held.started.set()
    assert held.release.wait(WAIT), "never released"
    with held.marker.open("a") as marker:
        marker.write(f"{args.text}\n")
    return Count(count=len(held.effects()))


@tool(name="cancelled_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=TIMEOUT)
async def cancelled_note(args: Text, ctx: ToolContext) -> Count:
    """An async write that never finishes: it is cancelled at its deadline."""
    await asyncio.Event().wait()
    return Count(count=0)


@dataclass
class World:
    """One JWT sidecar on TCP over a store; alice calls."""

    target: str
    token: str
    store: Any  # ``SqlStore``: its ``audit_events`` too
    held: Overrun
    clients: list[AsyncClient] = field(default_factory=list)

    @property
    def agent(self) -> AsyncClient:
        self.clients.append(client := AsyncClient(self.target, token=self.token))
        return client

    async def state(self, tool: str, key: str) -> OperationState:
        return (await self.agent.get_operation(tool, key)).state

    async def reaches(self, tool: str, key: str, state: OperationState) -> None:
        async def there() -> bool:
            return await self.state(tool, key) is state

        await until(there, timeout=WAIT, what=f"{tool} {key} {state}")


@contextlib.asynccontextmanager
async def open_world(store: Store, tmp_path: Path, settings: Settings, token: str) -> AsyncIterator[World]:
    """A sidecar with ``overrun_note`` and ``cancelled_note`` over ``store``, stopped on leaving."""
    held = Overrun(tmp_path / "effects.txt")
    OVERRUN.append(held)
    registry = Registry.from_tools([overrun_note, cancelled_note])
    engine = EmbeddedEngine.load(bundled_policy_dir())
    pipeline: Pipeline = assemble(registry=registry, policy=engine, store=store, limits=Limits())
    _, sidecar = await create_server(settings, pipeline)
    await sidecar.start()
    made = World(sidecar.addresses[-1], token, store, held)
    try:
        yield made
    finally:
        held.release.set()  # a handler still held ends now
        await asyncio.gather(*(client.close() for client in made.clients))
        await sidecar.stop(None)
        await pipeline.aclose()


@pytest.fixture(params=BACKENDS, ids=str)
async def world(request: pytest.FixtureRequest, tmp_path: Path, make_settings: Callable[..., Settings],
                jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> AsyncIterator[World]:
    store = await open_store(request, tmp_path)
    async with open_world(store, tmp_path, make_settings(auth=jwt_auth), make_token(sub="alice")) as made:
        yield made


@pytest.fixture
async def sqlite_world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                       make_token: Callable[..., str]) -> AsyncIterator[World]:
    store = await SqliteStore.open(tmp_path / "store.db")
    async with open_world(store, tmp_path, make_settings(auth=jwt_auth), make_token(sub="alice")) as made:
        yield made


def timed_out(result: ToolResult) -> None:
    assert result.status is Status.ERROR and result.error is not None, result
    assert result.error.code is ErrorCode.TIMEOUT and result.meta.attempt == 1, result
    assert not result.error.retryable and result.error.recovery is Recovery.CHECK_OPERATION_STATUS, result


def in_progress(result: ToolResult) -> None:
    assert result.error is not None and result.error.code is ErrorCode.OPERATION_IN_PROGRESS, result
    assert result.error.recovery is Recovery.CHECK_OPERATION_STATUS and "unknown" in result.error.message


async def test_a_sync_write_that_outlives_its_deadline_is_unknown_until_it_ends(world: World) -> None:
    timed_out(first := await world.agent.execute("overrun_note", {"text": "a"}, idempotency_key="k-1"))
    assert world.held.started.is_set() and world.held.effects() == []  # it still runs
    assert await world.state("overrun_note", "k-1") is OperationState.UNKNOWN
    in_progress(await world.agent.execute("overrun_note", {"text": "a"}, idempotency_key="k-1"))

    world.held.release.set()
    await world.reaches("overrun_note", "k-1", OperationState.COMPLETED)
    assert world.held.effects() == ["a"] and world.held.starts == 1
    operation = await world.agent.get_operation("overrun_note", "k-1")
    assert operation.result is not None and operation.result.data == {"count": 1}
    replay = await world.agent.execute("overrun_note", {"text": "a"}, idempotency_key="k-1")
    assert replay.status is Status.SUCCESS and replay.meta.idempotency_replayed and replay.data == {"count": 1}
    assert world.held.starts == 1  # never run again

    await world.store.flush_audit()
    events = [(e.status, e.error_code) for e in await world.store.audit_events()
              if e.request_id == first.meta.request_id]
    assert events == [("dispatching", None), ("error", "TIMEOUT"), ("success", None)]


async def resolve(config: Path, tool: str, key: str, *outcome: str) -> int:
    """``toolbooth operations resolve`` of alice's ``key`` (in a thread: the command runs its own event loop)."""
    return await asyncio.to_thread(main, ["operations", "resolve", key, "--tool", tool, "--principal", "alice",
                                          "--tenant", "acme", *outcome, "--config", str(config)])


async def test_an_operator_resolves_an_unknown_write_and_its_late_result_does_not_overwrite_it(
        sqlite_world: World, tmp_path: Path, store_config: Callable[[Path], Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    world = sqlite_world
    timed_out(await world.agent.execute("overrun_note", {"text": "b"}, idempotency_key="k-2"))
    assert await world.state("overrun_note", "k-2") is OperationState.UNKNOWN
    config = store_config(tmp_path / "store.db")
    assert await resolve(config, "overrun_note", "k-2", "--failed", "--note", "undone by hand") == 0, \
        capsys.readouterr()
    assert await world.state("overrun_note", "k-2") is OperationState.FAILED

    world.held.release.set()  # the handler ends after the resolution: its result is audited, not stored
    async def late_outcome_audited() -> bool:
        return any(e.status == "success" for e in await world.store.audit_events())

    await until(late_outcome_audited, timeout=WAIT, what="the late outcome's audit event")
    replay = await world.agent.execute("overrun_note", {"text": "b"}, idempotency_key="k-2")
    assert replay.status is Status.ERROR and replay.meta.idempotency_replayed, replay
    assert replay.data == {"resolved_by_operator": True, "note": "undone by hand"}
    assert world.held.starts == 1 and world.held.effects() == ["b"]


async def test_an_async_write_cancelled_at_its_deadline_is_unknown_not_failed(
        sqlite_world: World, tmp_path: Path, store_config: Callable[[Path], Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    world = sqlite_world
    timed_out(await world.agent.execute("cancelled_note", {"text": "c"}, idempotency_key="k-3"))
    assert await world.state("cancelled_note", "k-3") is OperationState.UNKNOWN
    in_progress(await world.agent.execute("cancelled_note", {"text": "c"}, idempotency_key="k-3"))
    assert await resolve(store_config(tmp_path / "store.db"), "cancelled_note", "k-3", "--completed") == 0, \
        capsys.readouterr()
    replay = await world.agent.execute("cancelled_note", {"text": "c"}, idempotency_key="k-3")
    assert replay.status is Status.SUCCESS and replay.meta.idempotency_replayed, replay
    assert await world.state("cancelled_note", "k-3") is OperationState.COMPLETED


async def test_a_write_whose_deadline_passed_before_it_ran_is_retryable(
        tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
        make_token: Callable[..., str]) -> None:
    store: Any = LateClaims(await SqliteStore.open(tmp_path / "store.db"), {"k-4"})
    async with open_world(store, tmp_path, make_settings(auth=jwt_auth), make_token(sub="alice")) as world:
        late = await world.agent.execute("overrun_note", {"text": "d"}, idempotency_key="k-4")
        assert late.error is not None and late.error.code is ErrorCode.TIMEOUT and late.meta.attempt == 0, late
        assert late.error.message == "the call's deadline passed before the tool ran"
        assert late.error.retryable and late.error.recovery is Recovery.RETRY_SAME_REQUEST, late.error
        assert await world.state("overrun_note", "k-4") is OperationState.NOT_FOUND
        assert world.held.starts == 0  # nothing ran
        world.held.release.set()
        retry = await world.agent.execute("overrun_note", {"text": "d"}, idempotency_key="k-4", timeout=WAIT)
        assert retry.status is Status.SUCCESS and retry.data == {"count": 1}, retry
        assert world.held.starts == 1 and retry.meta.attempt == 1
