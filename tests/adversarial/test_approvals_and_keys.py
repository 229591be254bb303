"""Approvals and idempotency keys at their edges, through a real server (issue 8).

- A used approval never authorizes a second run, even after retention purged its key's record.
- A key whose claim outlived the call's deadline ran nothing: it is free for a retry (and an
  approval it used is given back), never burned with a stored ``TIMEOUT``.
- A keyed call whose key is in progress or reused spends no approval: the approval is consumed
  only once the call owns its key.
- A preview is bound to its conversation; one stored before previews were needs a new approval.
- A key's record stored before request hashes were RFC 8785 holds the older hash: a retry of that
  request (floats in its arguments, where the two forms differ) replays it, never IDEMPOTENCY_KEY_REUSED.

Each runs on SQLite and, where the behaviour depends on the store, on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import BaseModel

from sidecar.bootstrap import assemble
from sidecar.canonical import sha256_hex
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Limits, Settings
from sidecar.contract import ErrorCode, Preview, PreviewState, Principal, ResultMeta, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.pipeline.approvals import CallToApprove, preview_hash
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.server import create_server
from sidecar.state import KeyScope, PreviewRecord
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support import tools
from tests.support.approvals import NOTE, policies
from tests.support.stores import BACKENDS, LateClaims, open_store
from tests.support.tools import Count, Note

__all__ = ["jwt_auth", "make_settings", "make_token", "postgres", "postgres_dsn", "rsa_key", "socket_path"]

pytestmark = pytest.mark.integration
WAIT = 10.0  # seconds: the deadline of every wait for an event


class Held:
    """Holds ``held_note``'s handler until released, so that its key stays in progress."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()


HELD: list[Held] = []


@tool(name="held_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=WAIT)
async def held_note(args: Note, ctx: ToolContext) -> Count:
    """A write that needs approval and runs until the test releases it."""
    held = HELD[-1]
    held.started.set()
    await held.release.wait()
    return Count(count=tools.CREATED.bump())


class Amounts(BaseModel):
    amount: float
    rate: float


@tool(name="book_amount", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
async def book_amount(args: Amounts, ctx: ToolContext) -> Count:
    """A write whose arguments are floats."""
    return Count(count=tools.CREATED.bump())


@dataclass
class World:
    """One JWT sidecar on TCP over a store; alice calls, bob approves."""

    target: str
    tokens: Callable[..., str]
    pipeline: Pipeline
    store: Any  # the store the pipeline uses (``LateClaims`` around the real one, here)
    clients: list[AsyncClient] = field(default_factory=list)

    def client(self, sub: str, roles: list[str]) -> AsyncClient:
        self.clients.append(client := AsyncClient(self.target, token=self.tokens(sub=sub, roles=roles)))
        return client

    @property
    def agent(self) -> AsyncClient:
        return self.client("alice", ["developer"])

    async def approved(self, tool: str = "file_note", conversation_id: str | None = None) -> Preview:
        asked = await self.agent.execute(tool, NOTE, idempotency_key="k-ask", conversation_id=conversation_id)
        assert asked.status is Status.APPROVAL_REQUIRED and asked.preview is not None, asked
        approval = await self.client("bob", ["approver"]).approve(asked.preview.preview_id, asked.preview.preview_hash)
        assert approval.ok, approval
        return asked.preview

    async def state_of(self, preview: Preview) -> PreviewState:
        record = await self.store.get_preview(preview.preview_id)
        assert record is not None
        return PreviewState(record.state)


@pytest.fixture(params=BACKENDS, ids=str)
async def world(request: pytest.FixtureRequest, tmp_path: Path, make_settings: Callable[..., Settings],
                jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> AsyncIterator[World]:
    """A sidecar whose policies hold ``file_note`` and ``held_note`` for approval, on either backend."""
    inner = await open_store(request, tmp_path)
    store = LateClaims(inner)
    engine = policies(tmp_path / "policies", tools=["file_note", "held_note"])
    registry = Registry.from_tools([*tools.ALL, held_note, book_amount])
    pipeline = assemble(registry=registry, policy=engine, store=store, limits=Limits())  # type: ignore[arg-type]
    _, sidecar = await create_server(make_settings(auth=jwt_auth), pipeline, approvals=pipeline.approvals)
    await sidecar.start()
    made = World(sidecar.addresses[-1], make_token, pipeline, store)
    try:
        yield made
    finally:
        await asyncio.gather(*(client.close() for client in made.clients))
        await sidecar.stop(None)
        await pipeline.aclose()


def refused(result: ToolResult, code: ErrorCode) -> None:
    assert result.status is not Status.SUCCESS and result.error is not None, result
    assert result.error.code is code, result.error
    assert result.meta.attempt == 0, result


def ran(result: ToolResult) -> None:
    assert result.status is Status.SUCCESS and not result.meta.idempotency_replayed, result


# --- 1: a used approval, its key's record purged -----------------------------------------------------------


async def test_a_used_approval_never_runs_again_once_its_key_record_is_purged(world: World) -> None:
    preview, before = await world.approved(), tools.CREATED.value
    ran(await world.agent.execute("file_note", NOTE, idempotency_key="k-1", approval_id=preview.preview_id))
    replay = await world.agent.execute("file_note", NOTE, idempotency_key="k-1", approval_id=preview.preview_id)
    assert replay.status is Status.SUCCESS and replay.meta.idempotency_replayed  # the retry replays its result
    assert await world.store.expire_operations(time.time() + 1) >= 1  # retention removes the key's record
    for _ in range(2):  # refused, and refused again: the refusal ran nothing, so it stores nothing either
        again = await world.agent.execute("file_note", NOTE, idempotency_key="k-1", approval_id=preview.preview_id)
        refused(again, ErrorCode.PERMISSION_DENIED)
        assert again.error is not None and "already used" in again.error.message
        assert await world.store.operation(KeyScope("acme", "alice", "file_note", "k-1")) is None
    assert tools.CREATED.value == before + 1
    assert await world.state_of(preview) is PreviewState.USED


# --- 5: a claim that outlived the deadline ran nothing -------------------------------------------------------


async def test_a_key_whose_claim_outlived_the_deadline_is_free_for_a_retry(world: World) -> None:
    before = tools.CREATED.value
    world.store.late.add("k-late")
    world.store.gate = gate = asyncio.Event()
    with pytest.raises(ClientError) as late:
        await world.agent.execute("create_note", {"text": "x"}, idempotency_key="k-late", timeout=0.3)
    assert late.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    gate.set()  # the caller gave up: now the claim goes on, past its deadline
    await asyncio.wait_for(world.store.settled.wait(), WAIT)  # the detached call has ended
    assert await world.store.operation(KeyScope("acme", "alice", "create_note", "k-late")) is None
    assert tools.CREATED.value == before
    ran(retry := await world.agent.execute("create_note", {"text": "x"}, idempotency_key="k-late"))
    assert tools.CREATED.value == before + 1 and retry.data == {"count": before + 1}


async def test_an_approval_whose_call_outlived_its_deadline_is_given_back(world: World) -> None:
    preview, before = await world.approved(), tools.CREATED.value
    world.store.late.add("k-late")
    world.store.gate = gate = asyncio.Event()
    with pytest.raises(ClientError) as late:
        await world.agent.execute("file_note", NOTE, idempotency_key="k-late", approval_id=preview.preview_id,
                                  timeout=0.3)
    assert late.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    gate.set()
    await asyncio.wait_for(world.store.settled.wait(), WAIT)
    assert await world.state_of(preview) is PreviewState.APPROVED and tools.CREATED.value == before
    ran(await world.agent.execute("file_note", NOTE, idempotency_key="k-late", approval_id=preview.preview_id))
    assert await world.state_of(preview) is PreviewState.USED and tools.CREATED.value == before + 1


# --- 7: the approval is spent only by a call that owns its key ----------------------------------------------


async def test_a_key_in_progress_or_reused_spends_no_approval(world: World) -> None:
    HELD.append(held := Held())
    first, second = await world.approved("held_note"), await world.approved("held_note")
    running = asyncio.create_task(world.agent.execute("held_note", NOTE, idempotency_key="k-1",
                                                      approval_id=first.preview_id))
    try:
        await asyncio.wait_for(held.started.wait(), WAIT)
        busy = await world.agent.execute("held_note", NOTE, idempotency_key="k-1", approval_id=second.preview_id)
        refused(busy, ErrorCode.OPERATION_IN_PROGRESS)
        assert await world.state_of(second) is PreviewState.APPROVED  # not spent by a call that did not run
    finally:
        held.release.set()
    ran(await running)
    # another request holds the key: IDEMPOTENCY_KEY_REUSED, and the approval is still not spent
    assert (await world.store.claim(KeyScope("acme", "alice", "held_note", "k-taken"), "sha256:another-request",
                                    "r-other", deadline_at=time.time() + 60)).claimed
    reused = await world.agent.execute("held_note", NOTE, idempotency_key="k-taken", approval_id=second.preview_id)
    refused(reused, ErrorCode.IDEMPOTENCY_KEY_REUSED)
    assert await world.state_of(second) is PreviewState.APPROVED
    before = tools.CREATED.value
    ran(await world.agent.execute("held_note", NOTE, idempotency_key="k-2", approval_id=second.preview_id))
    assert tools.CREATED.value == before + 1 and await world.state_of(second) is PreviewState.USED


async def test_a_preview_approved_in_one_conversation_runs_in_no_other(world: World) -> None:
    preview, before = await world.approved(conversation_id="conv-a"), tools.CREATED.value
    assert json.loads(preview.call_json)["conversation_id"] == "conv-a"
    for elsewhere in ("conv-b", None):
        other = await world.agent.execute("file_note", NOTE, idempotency_key=f"k-{elsewhere}",
                                          approval_id=preview.preview_id, conversation_id=elsewhere)
        refused(other, ErrorCode.INVALID_ARGUMENT)
        assert other.error is not None and "conversation" in other.error.message
    assert tools.CREATED.value == before and await world.state_of(preview) is PreviewState.APPROVED
    ran(await world.agent.execute("file_note", NOTE, idempotency_key="k-a", approval_id=preview.preview_id,
                                  conversation_id="conv-a"))
    assert tools.CREATED.value == before + 1


async def test_a_preview_stored_before_conversations_were_bound_needs_a_new_approval(world: World) -> None:
    alice = Principal(id="alice", tenant="acme")
    call = CallToApprove(alice, "file_note", "1.0.0", NOTE, world.pipeline.policy.revision)
    legacy = call.canonical(bound=False)  # what an older sidecar hashed and stored
    now = time.time()
    await world.store.save_preview(PreviewRecord(
        preview_id="legacy-preview", preview_hash=preview_hash(legacy), tenant="acme", principal_id="alice",
        tool="file_note", tool_version="1.0.0", call_json=json.dumps(legacy), policy_revision=call.policy_revision,
        reason="needs approval", approver_roles=("approver",), created_at=now, expires_at=now + 900), max_pending=100)
    assert await world.store.decide_preview("legacy-preview", PreviewState.APPROVED, now=now, comment=None,
                                            decided_by=Principal(id="bob", roles=("approver",)).model_dump_json())
    before = tools.CREATED.value
    for conversation in ("conv-a", None):
        result = await world.agent.execute("file_note", NOTE, idempotency_key="k-1", approval_id="legacy-preview",
                                           conversation_id=conversation)
        assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
        assert json.loads(result.preview.call_json)["conversation_id"] == conversation
    assert tools.CREATED.value == before


# --- a key's record stored before RFC 8785 ----------------------------------------------------------------


async def test_a_key_record_stored_with_the_hash_before_rfc8785_is_replayed(world: World) -> None:
    arguments = {"amount": 10.0, "rate": 1e-7}
    request = {"tool": "book_amount", "version": "1.0.0", "arguments": arguments}
    # what a sidecar hashed before RFC 8785: Python's sorted, compact JSON ("10.0", "1e-07"; JCS: "10", "1e-7")
    old_hash = "sha256:" + hashlib.sha256(json.dumps(request, sort_keys=True, separators=(",", ":"),
                                                     ensure_ascii=False).encode()).hexdigest()
    assert old_hash != sha256_hex(request)
    scope = KeyScope("acme", "alice", "book_amount", "k-old")
    stored = ToolResult(status=Status.SUCCESS, data={"count": -1},
                        meta=ResultMeta(request_id="r-old", tool="book_amount", tool_version="1.0.0", attempt=1))
    assert (await world.store.claim(scope, old_hash, "r-old")).claimed  # as that sidecar claimed and completed it
    await world.store.complete(scope, stored.model_dump_json(), request_id="r-old")
    before = tools.CREATED.value
    for _ in range(2):
        replay = await world.agent.execute("book_amount", arguments, idempotency_key="k-old")
        assert replay.status is Status.SUCCESS and replay.meta.idempotency_replayed, replay
        assert replay.data == {"count": -1}
    other = await world.agent.execute("book_amount", {"amount": 10.5, "rate": 1e-7}, idempotency_key="k-old")
    refused(other, ErrorCode.IDEMPOTENCY_KEY_REUSED)  # another request is still another request
    assert tools.CREATED.value == before
    ran(await world.agent.execute("book_amount", arguments, idempotency_key="k-new"))
