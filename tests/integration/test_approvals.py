"""Approvals through a real server: preview, approve with another principal's token, run exactly once,
and every way a tampered, replayed, denied, expired or re-decided approval runs nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import assemble
from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.config import Limits, Settings
from sidecar.contract import ErrorCode, Preview, PreviewState, Recovery, Requester, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.policy import DelegatingEngine, PolicyEngine
from sidecar.server import create_server
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.approvals import NOTE, policies
from tests.support.clock import MovedClock
from tests.support.tables import table_rows

Tokens = Callable[..., str]


class SwappableEngine(DelegatingEngine):
    """A policy engine whose policies a test replaces between two calls (a new revision). Closing it
    closes every engine it held, here, on the thread that evaluated them (regorus requires it)."""

    def __init__(self, inner: PolicyEngine) -> None:
        self.held: list[PolicyEngine] = []
        super().__init__(inner)

    @property
    def inner(self) -> PolicyEngine:
        return self.held[-1]

    @inner.setter
    def inner(self, engine: PolicyEngine) -> None:
        self.held.append(engine)

    async def aclose(self) -> None:
        for engine in self.held:
            await engine.aclose()


class World:
    """One sidecar with approvals; ``client(sub, roles)`` connects with a token of that principal."""

    def __init__(self, target: str, tokens: Tokens, engine: SwappableEngine, tmp: Path, store: SqliteStore,
                 clock: MovedClock) -> None:
        self.target, self.tokens, self.engine, self.tmp, self.store = target, tokens, engine, tmp, store
        self.clock = clock
        self.clients: list[AsyncClient] = []

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

    async def preview(self, arguments: Any = None, key: str = "k-1") -> Preview:
        result = await self.agent.execute("file_note", NOTE if arguments is None else arguments, idempotency_key=key)
        assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None
        return result.preview

    async def approved(self, **changes: Any) -> Preview:
        preview = await self.preview(**changes)
        assert (await self.approver.approve(preview.preview_id, preview.preview_hash, comment="fine")).ok
        return preview


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Tokens) -> AsyncIterator[Callable[..., Awaitable[World]]]:
    """``await world(**approval_data)``: a JWT sidecar on TCP with the test tools and a SQLite store."""
    pipelines: list[Pipeline] = []
    servers: list[Any] = []
    made: list[World] = []

    async def make(**approval: Any) -> World:
        engine = SwappableEngine(policies(tmp_path / "policies", **approval))
        store = await SqliteStore.open(tmp_path / "store.db")
        clock = MovedClock()
        pipeline = assemble(registry=Registry.from_tools(tools.ALL), policy=engine, store=store, limits=Limits(),
                            clock=clock)
        pipelines.append(pipeline)
        _, sidecar = await create_server(make_settings(auth=jwt_auth), pipeline, approvals=pipeline.approvals)
        servers.append(sidecar)
        await sidecar.start()
        made.append(world := World(sidecar.addresses[-1], make_token, engine, tmp_path, store, clock))
        return world

    yield make
    for world in made:
        await asyncio.gather(*(client.close() for client in world.clients))
    for sidecar in servers:
        await sidecar.stop(None)
    for pipeline in pipelines:
        await pipeline.aclose()


def refused(result: ToolResult, code: ErrorCode) -> None:
    assert result.status is not Status.SUCCESS and result.error is not None, result
    assert result.error.code is code, result.error
    assert result.meta.attempt == 0


async def test_happy_path_runs_the_approved_call_once(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    before = tools.CREATED.value
    preview = await w.preview()
    assert preview.state is PreviewState.PENDING and preview.approver_roles == ("approver",)
    call = json.loads(preview.call_json)
    assert call["tool"] == "file_note" and call["arguments"] == NOTE
    assert call["principal"] == {"id": "alice", "tenant": "acme"} and call["policy_revision"] == w.engine.revision
    approval = await w.approver.approve(preview.preview_id, preview.preview_hash, comment="fine")
    assert approval.ok and approval.preview is not None
    assert (approval.preview.state, approval.preview.decided_by, approval.preview.comment) == (
        PreviewState.APPROVED, "bob", "fine")
    result = await w.agent.execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert result.status is Status.SUCCESS and result.data == {"count": before + 1}
    replay = await w.agent.execute("file_note", NOTE, idempotency_key="k-3", approval_id=preview.preview_id)
    refused(replay, ErrorCode.PERMISSION_DENIED)
    assert replay.error is not None and "already used" in replay.error.message
    retry = await w.agent.execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert retry.status is Status.SUCCESS and retry.meta.idempotency_replayed and retry.data == result.data
    assert tools.CREATED.value == before + 1


async def test_reordered_keys_still_match(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.approved()
    result = await w.agent.execute("file_note", '{"body": "at noon",  "title": "launch"}', idempotency_key="k-2",
                                   approval_id=preview.preview_id)
    assert result.status is Status.SUCCESS


async def test_changed_argument_runs_nothing_and_keeps_the_approval(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.approved()
    changed = await w.agent.execute("file_note", {**NOTE, "body": "at midnight"}, idempotency_key="k-2",
                                    approval_id=preview.preview_id)
    refused(changed, ErrorCode.INVALID_ARGUMENT)
    assert changed.error is not None and changed.error.recovery is Recovery.CORRECT_ARGUMENTS
    assert (await w.agent.execute("file_note", NOTE, idempotency_key="k-3",
                                  approval_id=preview.preview_id)).status is Status.SUCCESS


async def test_another_principal_cannot_use_the_approval(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.approved()
    other = await w.client("carol").execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    refused(other, ErrorCode.PERMISSION_DENIED)


@pytest.mark.parametrize(("sub", "roles", "tenant"), [
    ("alice", ("developer", "approver"), "acme"),  # self-approval
    ("bob", ("developer",), "acme"),  # no approver role
    ("bob", ("approver",), "globex"),  # another tenant
], ids=["self", "no-role", "other-tenant"])
async def test_who_may_not_approve(world: Callable[..., Awaitable[World]], sub: str, roles: tuple[str, ...],
                                   tenant: str) -> None:
    w = await world()
    preview = await w.preview()
    result = await w.client(sub, roles, tenant).approve(preview.preview_id, preview.preview_hash)
    assert not result.ok and result.error is not None and result.error.code is ErrorCode.PERMISSION_DENIED
    assert result.preview is None
    pending = await w.agent.execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert pending.status is Status.APPROVAL_REQUIRED and pending.preview == preview


async def test_hash_mismatch_approves_nothing(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.preview()
    other = await w.preview({**NOTE, "body": "at midnight"}, key="k-2")
    result = await w.approver.approve(preview.preview_id, other.preview_hash)
    assert not result.ok and result.error is not None and result.error.code is ErrorCode.INVALID_ARGUMENT
    assert result.error.field == "preview_hash" and result.preview is not None
    assert result.preview.state is PreviewState.PENDING


async def test_unknown_preview(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    result = await w.approver.approve("no-such-preview", "sha256:00")
    assert not result.ok and result.error is not None and result.error.code is ErrorCode.RESOURCE_NOT_FOUND
    refused(await w.agent.execute("file_note", NOTE, idempotency_key="k", approval_id="no-such-preview"),
            ErrorCode.RESOURCE_NOT_FOUND)


async def test_denied_call_never_runs(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.preview()
    assert not (await w.approver.deny(preview.preview_id, reason=" ")).ok  # a reason is required
    denial = await w.approver.deny(preview.preview_id, reason="not before the review")
    assert denial.ok and denial.preview is not None and denial.preview.state is PreviewState.DENIED
    late = await w.approver.approve(preview.preview_id, preview.preview_hash)
    assert not late.ok and late.error is not None and late.error.code is ErrorCode.INVALID_ARGUMENT
    result = await w.agent.execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    refused(result, ErrorCode.PERMISSION_DENIED)
    assert result.error is not None and "not before the review" in result.error.message


async def test_expired_preview(world: Callable[..., Awaitable[World]]) -> None:
    w = await world(preview_ttl_seconds=60)
    approved, pending = await w.approved(), await w.preview(key="k-2")
    w.clock.advance(60)
    late = await w.approver.approve(pending.preview_id, pending.preview_hash)
    assert not late.ok and late.error is not None and late.error.code is ErrorCode.PREVIEW_EXPIRED
    result = await w.agent.execute("file_note", NOTE, idempotency_key="k-3", approval_id=approved.preview_id)
    refused(result, ErrorCode.PREVIEW_EXPIRED)
    assert result.error is not None and result.error.recovery is Recovery.REQUEST_USER_INPUT


async def test_policy_change_reevaluates_the_approval(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    kept, dropped = await w.approved(), await w.approved(key="k-2")
    w.engine.inner = policies(w.tmp / "stricter", approver_roles=["security"])  # bob is no longer enough
    result = await w.agent.execute("file_note", NOTE, idempotency_key="k-3", approval_id=dropped.preview_id)
    assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None
    assert result.preview.approver_roles == ("security",) and result.preview.preview_id != dropped.preview_id
    security = w.client("sam", ("security",))
    assert (await security.approve(result.preview.preview_id, result.preview.preview_hash)).ok
    rerun = await w.agent.execute("file_note", NOTE, idempotency_key="k-4", approval_id=result.preview.preview_id)
    assert rerun.status is Status.SUCCESS
    w.engine.inner = policies(w.tmp / "relaxed", tools=[])  # no approval needed at all: the old one still counts
    assert (await w.agent.execute("file_note", NOTE, idempotency_key="k-5",
                                  approval_id=kept.preview_id)).status is Status.SUCCESS


async def test_list_previews_shows_what_the_caller_may_approve(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.preview()
    assert [p.preview_id for p in await w.approver.previews()] == [preview.preview_id]
    assert await w.client("carol").previews() == []
    assert [p.preview_id for p in await w.client("olga", ("operator",)).previews()] == [preview.preview_id]


async def test_a_preview_names_its_tool_and_who_asked_as_the_approver_rule_reads_them(
        world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    held = await w.preview()
    [listed] = await w.approver.previews()
    decided = (await w.approver.approve(held.preview_id, held.preview_hash)).preview
    for preview in (held, listed, decided):
        assert preview is not None and preview.tool == "file_note"
        assert preview.requested_by == Requester(id="alice", tenant="acme")


async def test_cli_lists_approves_and_denies(world: Callable[..., Awaitable[World]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    w = await world()
    first, second = await w.preview(), await w.preview({**NOTE, "body": "later"}, key="k-2")
    bob = ["--target", w.target, "--token", w.tokens(sub="bob", roles=["approver"])]

    async def toolbooth(*argv: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, [*argv, *bob])
        return code, capsys.readouterr().out

    code, out = await toolbooth("previews", "list")
    header, *rows = out.splitlines()
    assert code == 0 and header.split() == ["PREVIEW", "TOOL", "EXPIRES", "ROLES", "REASON"]
    assert sorted(row.split()[:4] for row in rows) == sorted(
        [p.preview_id, "file_note", p.expires_at, "approver"] for p in (first, second))
    code, out = await toolbooth("previews", "list", "--long")
    assert code == 0 and first.preview_id in out and second.preview_hash in out and '"body":"later"' in out
    code, out = await toolbooth("approve", first.preview_id, "--comment", "ok")  # the hash `previews list` shows
    assert code == 0 and json.loads(out)["preview"]["state"] == "approved"
    code, out = await toolbooth("approve", second.preview_id, "--hash", first.preview_hash)
    assert code == 3 and json.loads(out)["error"]["code"] == "INVALID_ARGUMENT"
    code, out = await toolbooth("deny", second.preview_id, "--reason", "too late")
    assert code == 0 and json.loads(out)["preview"]["comment"] == "too late"
    code, out = await toolbooth("previews", "list", "--output", "json")
    assert code == 0 and json.loads(out) == []


@pytest.mark.parametrize(("width", "widest"), [(60, 60), (40, 49)])
async def test_cli_previews_table_in_a_narrow_terminal(world: Callable[..., Awaitable[World]],
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, width: int,
                                                       widest: int) -> None:
    """Ids (their first 12 characters) and expiries stay whole on their row's first line; the other columns fold,
    down to 3 cells (at 40 columns the table is wider, by what the whole ones need)."""
    w = await world()
    held = [await w.preview(), await w.preview({**NOTE, "body": "later"}, key="k-2")]
    monkeypatch.setenv("COLUMNS", str(width))
    code = await asyncio.to_thread(main, ["previews", "list", "--target", w.target, "--token",
                                          w.tokens(sub="bob", roles=["approver"])])
    out = capsys.readouterr().out
    rows = table_rows(out, ["PREVIEW", "TOOL", "EXPIRES", "ROLES", "REASON"], anchor=0)
    assert code == 0 and max(len(line) for line in out.splitlines()) == widest
    listed = await w.approver.previews()  # newest first, as the table
    assert sorted(p.preview_id for p in listed) == sorted(p.preview_id for p in held)
    assert rows == [[p.preview_id[:12], "file_note", p.expires_at, "approver", "".join(p.reason.split())]
                    for p in listed]
    for preview in listed:
        first = next(line for line in out.splitlines() if line.startswith(preview.preview_id[:12]))
        assert preview.expires_at in first, out


async def test_sensitive_values_are_masked_in_the_preview_yet_bound(world: Callable[..., Awaitable[World]]) -> None:
    w = await world(mask=["/body"])
    preview = await w.approved()
    shown = json.loads(preview.call_json)["arguments"]
    assert shown["title"] == "launch" and shown["body"].startswith("hmac-sha256:") and "noon" not in preview.call_json
    other = await w.agent.execute("file_note", {**NOTE, "body": "at midnight"}, idempotency_key="k-2",
                                  approval_id=preview.preview_id)
    refused(other, ErrorCode.INVALID_ARGUMENT)
    assert (await w.agent.execute("file_note", NOTE, idempotency_key="k-3",
                                  approval_id=preview.preview_id)).status is Status.SUCCESS


async def test_approvers_attempts_are_audited(world: Callable[..., Awaitable[World]]) -> None:
    w = await world()
    preview = await w.preview()
    await w.client("alice", ("approver",)).approve(preview.preview_id, preview.preview_hash)  # self-approval
    await w.approver.approve(preview.preview_id, preview.preview_hash, comment="fine")
    events = [e for e in await w.store.audit_events() if "approver" in json.loads(e.decisions_json)]
    assert [(e.principal_id, e.status, e.error_code) for e in events] == [
        ("alice", "refused", "PERMISSION_DENIED"), ("bob", "approved", None)]
    assert events[1].tool == "file_note" and events[1].input_hash == preview.preview_hash
    assert json.loads(events[1].decisions_json) == {
        "approver": {"preview_id": preview.preview_id, "decision": "approved", "comment": "fine"}}
