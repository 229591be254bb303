"""Approval of exactly what will happen, through a real sidecar: the approver sees the tool's rendering of
the held call (recipients, subject, body), the hash covers it, the handler gets exactly the approved
rendering, and a rendering changed in the store after approval runs nothing. Also the default policy's
rule that recipients outside the organization need an extra permission."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.canonical import canonical_json, sha256_hex
from sidecar.cli import main
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Preview, PreviewState, Principal, Status
from sidecar.pipeline.approvals import CallToApprove, preview_hash
from sidecar.state import PreviewRecord
from tests.support import contract_tools
from tests.support.contract_tools import DRAFTS, SENT
from tests.support.gated import World, gated

MAIL = {"recipients": [{"email": "Ana@Example.com"}], "cc": [{"email": "ops@example.com"}],
        "subject": "Deployment complete", "body_text": "The new version has been deployed."}
RENDERED = {"to": ["ana@example.com"], "cc": ["ops@example.com"], "subject": "Deployment complete",
            "body": "The new version has been deployed."}


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str]) -> AsyncIterator[World]:
    async with gated(contract_tools.ALL, make_settings(auth=jwt_auth), make_token, tmp_path / "store.db") as w:
        yield w


async def held(world: World, mail: dict[str, Any] = MAIL) -> tuple[str, Preview]:
    """Preview a mail, then ask to send it: the draft's id and the preview the gate holds the send with."""
    draft = await world.agent.execute("send_email_preview", mail)
    assert draft.status is Status.SUCCESS, draft
    preview_id = draft.data["preview_id"]
    result = await world.agent.execute("send_email", {"preview_id": preview_id}, idempotency_key=f"send-{preview_id}")
    assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
    return preview_id, result.preview


async def test_the_approver_sees_and_approves_the_rendering_the_handler_sends(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    draft_id, preview = await held(world)
    [listed] = await world.approver.previews()
    assert listed.preview_id == preview.preview_id and listed.rendering_json is not None
    assert json.loads(listed.rendering_json) == RENDERED
    call = json.loads(listed.call_json)
    assert call["rendering"] == RENDERED and call["arguments"] == {"preview_id": draft_id}
    assert listed.preview_hash == sha256_hex(call)  # the hash covers the rendering
    bob = ["--target", world.target, "--token", world.tokens(sub="bob", roles=["approver"])]
    code = await asyncio.to_thread(main, ["previews", "list", "--long", *bob])
    out = capsys.readouterr().out
    assert code == 0 and '"subject": "Deployment complete"' in out and '"ana@example.com"' in out
    assert '"body": "The new version has been deployed."' in out
    assert (await world.approver.approve(preview.preview_id, preview.preview_hash, comment="ok")).ok
    DRAFTS[draft_id]["subject"] = "Changed after approval"  # the tool's own store changes: the approval holds
    before = len(SENT)
    sent = await world.agent.execute("send_email", {"preview_id": draft_id}, idempotency_key=f"send-{draft_id}",
                                     approval_id=preview.preview_id)
    assert sent.status is Status.SUCCESS, sent
    assert sent.data == {"sent_to": ["ana@example.com", "ops@example.com"], "subject": "Deployment complete"}
    assert SENT[before:] == [RENDERED]


async def test_a_rendering_changed_in_the_store_after_approval_runs_nothing(world: World) -> None:
    draft_id, preview = await held(world)
    assert (await world.approver.approve(preview.preview_id, preview.preview_hash)).ok
    call = json.loads(preview.call_json)
    call["rendering"]["to"] = ["attacker@evil.test"]
    await world.store.driver.execute("UPDATE previews SET call_json = ? WHERE preview_id = ?",
                                     (json.dumps(call), preview.preview_id))
    before = len(SENT)
    result = await world.agent.execute("send_email", {"preview_id": draft_id}, idempotency_key=f"send-{draft_id}",
                                       approval_id=preview.preview_id)
    assert result.status is Status.ERROR and result.error is not None, result
    assert result.error.code is ErrorCode.PERMISSION_DENIED and "changed" in result.error.message
    assert result.meta.attempt == 0 and len(SENT) == before
    [event] = [e for e in await world.store.audit_events() if e.tool == "send_email" and e.status == "error"]
    assert event.error_code == "PERMISSION_DENIED" and preview.preview_id in event.decisions_json


async def test_a_changed_pending_preview_cannot_be_approved(world: World) -> None:
    _, preview = await held(world)
    call = json.loads(preview.call_json)
    call["rendering"]["body"] = "Wire the money."
    await world.store.driver.execute("UPDATE previews SET call_json = ? WHERE preview_id = ?",
                                     (json.dumps(call), preview.preview_id))
    approval = await world.approver.approve(preview.preview_id, preview.preview_hash)
    assert not approval.ok and approval.error is not None and approval.error.code is ErrorCode.PERMISSION_DENIED


async def test_a_renderer_that_fails_stores_no_preview(world: World) -> None:
    unknown = await world.agent.execute("send_email", {"preview_id": "draft-none"}, idempotency_key="s-1")
    assert unknown.status is Status.ERROR and unknown.error is not None and unknown.preview is None
    assert (unknown.error.code, unknown.error.field) == (ErrorCode.RESOURCE_NOT_FOUND, "preview_id")
    broken = await world.agent.execute("broken_preview", {"preview_id": "p"}, idempotency_key="s-2")
    assert broken.error is not None and broken.error.code is ErrorCode.INTERNAL_ERROR and broken.preview is None
    assert "hunter2" not in broken.model_dump_json()
    [(count,)] = await world.store.driver.fetch("SELECT count(*) FROM previews")
    assert count == 0


@pytest.mark.parametrize(("roles", "recipient", "allowed"), [
    (("developer",), "bo@example.com", True),
    (("developer",), "bo@partner.org", False),
    (("admin",), "bo@partner.org", True),
])
async def test_recipients_outside_the_organization_need_an_extra_permission(
        world: World, roles: tuple[str, ...], recipient: str, allowed: bool) -> None:
    mail = {**MAIL, "cc": [{"email": recipient}]}
    result = await world.client("carol", roles).execute("send_email_preview", mail)
    if allowed:
        assert result.status is Status.SUCCESS, result
    else:
        assert result.error is not None and result.error.code is ErrorCode.PERMISSION_DENIED
        assert result.error.message == ("sending to recipients outside the organization (partner.org) needs "
                                        "permission email:send_external")


async def test_an_approval_stored_without_the_tools_rendering_needs_a_new_one(world: World) -> None:
    draft = await world.agent.execute("send_email_preview", MAIL)
    arguments = {"preview_id": draft.data["preview_id"]}
    alice = Principal(id="alice", tenant="acme")
    call = CallToApprove(alice, "send_email", "1.0.0", arguments, world.revision, None)
    canonical = call.canonical()  # as a sidecar stored it before the tool rendered its calls
    now = time.time()
    await world.store.save_preview(PreviewRecord(
        preview_id="unrendered", preview_hash=preview_hash(canonical), tenant="acme", principal_id="alice",
        tool="send_email", tool_version="1.0.0", call_json=canonical_json(canonical),
        policy_revision=call.policy_revision, reason="r", approver_roles=("approver",), created_at=now,
        expires_at=now + 900), max_pending=100)
    assert await world.store.decide_preview("unrendered", PreviewState.APPROVED, now=now, comment=None,
                                            decided_by=Principal(id="bob", roles=("approver",)).model_dump_json())
    before = len(SENT)
    result = await world.agent.execute("send_email", arguments, idempotency_key="s-1", approval_id="unrendered")
    assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
    assert result.error is not None and "before the tool rendered its calls" in result.error.message
    assert result.preview.rendering_json is not None and json.loads(result.preview.rendering_json) == RENDERED
    assert len(SENT) == before
