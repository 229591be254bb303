"""Stages added in each slot of the chain (``Stages``), written here alone, run in their place in a real sidecar.

In each slot: a stage that does nothing, one that notes what it saw of the call, and (one slot at a time) one
that refuses. The calls go through a real server on a real socket; no production module knows these stages.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import open_pipeline
from sidecar.bootstrap import serve as serve_sidecar
from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.contract import ErrorCode, ErrorInfo, Status, ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.order import Stages
from sidecar.tools.registry import Registry
from tests.integration.conftest import StartSidecar
from tests.support import tools
from tests.support.waiting import until

pytestmark = pytest.mark.integration

SLOTS = ("observers", "before_decisions", "after_decisions", "before_dispatch")


class Passing:
    """Does nothing but pass the call on."""

    async def run(self, call: Call, next: Next) -> ToolResult:
        return await next(call)


@dataclass(frozen=True)
class Seen:
    """What a stage saw of a call on its way in."""

    slot: str
    tool: str
    resolved: bool  # the resolve stage had found the tool
    validated: bool  # the validate stage had kept the arguments
    decided: tuple[str, ...]  # the policy decisions made so far
    claimed: str | None  # the key the idempotency stage claimed for the call, detaching it from its caller


@dataclass
class Noting:
    """Notes what it saw of each call and the status that came back."""

    slot: str
    seen: list[Seen | str]

    async def run(self, call: Call, next: Next) -> ToolResult:
        claimed = None if call.claim is None else call.claim.key.key
        assert call.detached is (claimed is not None)
        self.seen.append(Seen(self.slot, call.request.tool, call.tool is not None, call.arguments is not None,
                              tuple(sorted(call.trail)), claimed))
        result = await next(call)
        self.seen.append(f"{self.slot} out: {result.status.value}")
        return result


@dataclass
class Refusing:
    """Refuses every call with ``RATE_LIMITED`` while ``armed``."""

    armed: bool = True
    refused: list[str] = field(default_factory=list)

    async def run(self, call: Call, next: Next) -> ToolResult:
        if self.armed:
            self.refused.append(call.request.tool)
            raise CallRefused(ErrorInfo.of(ErrorCode.RATE_LIMITED, "slow down"))
        return await next(call)


@dataclass
class Served:
    client: AsyncClient
    seen: list[Seen | str]

    def slots_reached(self) -> list[str]:
        return [entry.slot for entry in self.seen if isinstance(entry, Seen)]


Serve = Callable[..., Any]


@pytest.fixture
async def serve(make_settings: Callable[..., Settings], start_sidecar: StartSidecar) -> AsyncIterator[Serve]:
    """``await serve(**extra)``: a real sidecar whose every slot holds a no-op and a noting stage, and the
    ``extra`` stages of each slot after them; a client of it."""
    opened: list[Any] = []

    async def start(**extra: list[Any]) -> Served:
        seen: list[Seen | str] = []
        added = {slot: [Passing(), Noting(slot, seen), *extra.get(slot, [])] for slot in SLOTS}
        settings = make_settings()
        pipeline = await open_pipeline(settings, registry=Registry.from_tools(tools.ALL), stages=Stages(**added))
        opened.append(pipeline)
        sidecar = await start_sidecar(settings, pipeline)
        client = AsyncClient(sidecar.addresses[0], timeout=5)
        opened.append(client)
        return Served(client, seen)

    yield start
    for thing in reversed(opened):
        await (thing.close() if isinstance(thing, AsyncClient) else thing.aclose())


async def test_a_read_meets_every_slot_in_order_each_seeing_what_the_stages_before_it_did(serve: Serve) -> None:
    served = await serve()
    result = await served.client.execute("echo", {"text": "hi"})
    assert result.status is Status.SUCCESS and result.data["text"] == "hi"
    decisions = ("approval", "authz", "availability", "history", "history_read")  # and the history they read
    assert served.seen == [
        Seen("observers", "echo", False, False, (), None),
        Seen("before_decisions", "echo", False, False, (), None),
        Seen("after_decisions", "echo", True, True, decisions, None),
        Seen("before_dispatch", "echo", True, True, decisions, None),
        *(f"{slot} out: success" for slot in reversed(SLOTS))]


async def test_a_write_reaches_the_slot_before_dispatch_detached_and_only_while_it_owns_its_key(serve: Serve) -> None:
    served = await serve()
    first = await served.client.execute("create_note", {"text": "x"}, idempotency_key="k-1")
    assert first.status is Status.SUCCESS and not first.meta.idempotency_replayed
    decided = ("approval", "authz", "availability", "history", "history_read")
    assert [entry for entry in served.seen if isinstance(entry, Seen)][-2:] == [
        Seen("after_decisions", "create_note", True, True, decided, None),
        Seen("before_dispatch", "create_note", True, True, decided, "k-1")]
    served.seen.clear()
    replayed = await served.client.execute("create_note", {"text": "x"}, idempotency_key="k-1")
    assert replayed.meta.idempotency_replayed
    assert served.slots_reached() == ["observers", "before_decisions", "after_decisions"]


@pytest.mark.parametrize(("tool", "arguments", "reached"), [
    ("no_such_tool", {"text": "x"}, ["observers", "before_decisions"]),
    ("echo", {"text": 3}, ["observers", "before_decisions"]),  # invalid arguments
    ("delete_records", {"text": "x"}, ["observers", "before_decisions"]),  # denied
    ("send_email", {"text": "x"}, ["observers", "before_decisions"]),  # needs an approval
])
async def test_only_calls_the_policies_let_run_reach_the_slots_after_the_decisions(
        serve: Serve, tool: str, arguments: dict[str, Any], reached: list[str]) -> None:
    served = await serve()
    result = await served.client.execute(tool, arguments, idempotency_key="k-2")
    assert result.status is not Status.SUCCESS
    assert served.slots_reached() == reached
    assert served.seen[-1] == f"observers out: {result.status.value}"


@pytest.mark.parametrize("slot", SLOTS)
async def test_a_refusal_in_any_slot_is_the_calls_result_and_the_stages_after_it_never_run(
        serve: Serve, slot: str) -> None:
    refusing = Refusing()
    served = await serve(**{slot: [refusing]})
    result = await served.client.execute("echo", {"text": "hi"})
    assert result.status is Status.ERROR and result.error is not None
    assert (result.error.code, result.error.message) == (ErrorCode.RATE_LIMITED, "slow down")
    assert refusing.refused == ["echo"]
    assert served.slots_reached() == list(SLOTS[:SLOTS.index(slot) + 1])
    assert served.seen[-1] == "observers out: error"


async def test_a_write_refused_before_dispatch_ran_nothing_and_its_key_runs_again(serve: Serve) -> None:
    refusing = Refusing()
    served = await serve(before_dispatch=[refusing])
    before = tools.CREATED.value
    refused = await served.client.execute("create_note", {"text": "x"}, idempotency_key="k-3")
    assert refused.error is not None and refused.error.code is ErrorCode.RATE_LIMITED
    assert tools.CREATED.value == before
    refusing.armed = False
    ran = await served.client.execute("create_note", {"text": "x"}, idempotency_key="k-3")
    assert ran.status is Status.SUCCESS and not ran.meta.idempotency_replayed
    assert tools.CREATED.value == before + 1


async def test_the_served_sidecar_takes_its_stages_from_serve(make_settings: Callable[..., Settings],
                                                              tmp_path: Path) -> None:
    """``toolbooth serve``'s own entry (``sidecar.bootstrap.serve``) adds the stages too, and closes them."""
    seen: list[Seen | str] = []
    closing = Closing()
    socket = tmp_path / "tb.sock"
    settings = make_settings(server={"listen": [f"unix://{socket}"]})
    stop = asyncio.Event()
    task = asyncio.create_task(serve_sidecar(settings, registry=Registry.from_tools(tools.ALL), stop=stop,
                                             stages=Stages(before_dispatch=[Noting("before_dispatch", seen), closing])))
    try:
        await until(lambda: socket.exists() or task.done(), what="the sidecar to listen")
        async with AsyncClient(f"unix://{socket}", timeout=5) as client:
            assert (await client.execute("echo", {"text": "hi"})).status is Status.SUCCESS
    finally:
        stop.set()
        await task
    assert [entry.slot for entry in seen if isinstance(entry, Seen)] == ["before_dispatch"]
    assert closing.closed == 1


@dataclass
class Closing(Passing):
    """A stage with something to close: closed once, when the sidecar stops."""

    closed: int = 0

    async def aclose(self) -> None:
        self.closed += 1
