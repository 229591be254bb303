"""The email tools through a real sidecar under the bundled policies, with JWT principals: alice (a developer)
writes, bob (an approver) approves; a real SMTP server receives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import Settings
from sidecar.contract import ErrorCode, Status, ToolResult
from tests.support.gated import World, gated

from .conftest import Configure

pytestmark = pytest.mark.integration

MAIL: dict[str, Any] = {"recipients": [{"email": "Ana@Example.com", "display_name": "Ana"}],
                        "cc": [{"email": "ops@example.com"}], "subject": "Deployment complete",
                        "body_text": "The new version has been deployed."}


@pytest.fixture
def email_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The sections of the plugin's settings the sidecar of a test starts with (``indirect`` parameter)."""
    return getattr(request, "param", {})


@pytest.fixture
async def world(configure: Configure, email_config: dict[str, Any], tmp_path: Path,
                make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str]) -> AsyncIterator[World]:
    """A sidecar serving the plugin configured with ``configure(**email_config)``."""
    configure(**email_config)
    async with gated(configure.tools(), make_settings(auth=jwt_auth), make_token, tmp_path / "store.db") as w:
        yield w


async def held(world: World, mail: dict[str, Any] = MAIL, roles: tuple[str, ...] = ("developer",)) -> ToolResult:
    """Preview ``mail`` as alice, then ask to send it: the result the gate holds the send with."""
    alice = world.client("alice", roles)
    draft = await alice.execute("send_email_preview", mail)
    assert draft.status is Status.SUCCESS, draft
    preview_id = draft.data["preview_id"]
    result = await alice.execute("send_email", {"preview_id": preview_id}, idempotency_key=f"send-{preview_id}")
    assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
    return result


async def execute_approved(world: World, held_result: ToolResult, *, key: str | None = None,
                           roles: tuple[str, ...] = ("developer",)) -> ToolResult:
    assert held_result.preview is not None
    arguments = json.loads(held_result.preview.call_json)["arguments"]
    return await world.client("alice", roles).execute(
        "send_email", arguments, idempotency_key=key or f"send-{arguments['preview_id']}",
        approval_id=held_result.preview.preview_id)


async def approve(world: World, held_result: ToolResult) -> None:
    assert held_result.preview is not None
    approval = await world.approver.approve(held_result.preview.preview_id, held_result.preview.preview_hash)
    assert approval.ok, approval


async def test_the_approver_sees_the_email_and_the_approved_send_goes_out_once(world: World,
                                                                              mail_server: Any) -> None:
    first = await held(world)
    assert first.error is not None and first.error.code is ErrorCode.APPROVAL_REQUIRED
    assert mail_server.received == []  # rejects unapproved previews: nothing sent
    [listed] = await world.approver.previews()
    assert first.preview is not None and listed.preview_id == first.preview.preview_id and listed.rendering_json
    shown = json.loads(listed.rendering_json)["email"]
    assert shown["recipients"] == [{"email": "Ana@example.com", "display_name": "Ana"}]
    assert shown["cc"] == [{"email": "ops@example.com", "display_name": None}]
    assert (shown["subject"], shown["body_text"]) == ("Deployment complete", "The new version has been deployed.")
    assert shown["from"]["email"] == "toolbooth@example.com"
    await approve(world, first)

    sent = await execute_approved(world, first)
    assert sent.status is Status.SUCCESS, sent
    assert sent.data["accepted_recipients"] == ["Ana@example.com", "ops@example.com"]
    assert sent.data["rejected_recipients"] == []
    [got] = mail_server.received
    assert got.rcpt_tos == ["Ana@example.com", "ops@example.com"]
    assert (got.message["Subject"], got.message["To"]) == ("Deployment complete", "Ana <Ana@example.com>")
    assert got.message.get_content().strip() == "The new version has been deployed."

    replay = await execute_approved(world, first)  # the agent retries with the same key
    assert replay.status is Status.SUCCESS and replay.meta.idempotency_replayed and replay.data == sent.data
    reused = await execute_approved(world, first, key="another-key")  # the approval was used
    assert reused.error is not None and reused.error.code is ErrorCode.PERMISSION_DENIED
    assert len(mail_server.received) == 1


async def test_a_spent_draft_gets_no_second_approval(world: World, mail_server: Any) -> None:
    first = await held(world)
    await approve(world, first)
    assert (await execute_approved(world, first)).status is Status.SUCCESS
    assert first.preview is not None
    preview_id = json.loads(first.preview.call_json)["arguments"]["preview_id"]
    again = await world.agent.execute("send_email", {"preview_id": preview_id}, idempotency_key="send-again")
    assert again.status is Status.ERROR and again.error is not None and again.preview is None
    assert again.error.code is ErrorCode.INVALID_ARGUMENT and again.error.details == {"state": "sent"}
    assert len(mail_server.received) == 1


async def test_partial_delivery_through_the_gate(world: World, mail_server: Any) -> None:
    mail_server.refuse = {"ops@example.com"}
    first = await held(world)
    await approve(world, first)
    result = await execute_approved(world, first)
    assert result.status is Status.PARTIAL_SUCCESS and result.error is None, result
    assert result.data["accepted_recipients"] == ["Ana@example.com"]
    assert result.data["rejected_recipients"] == [{"email": "ops@example.com",
                                                   "reason": "550 5.1.1 mailbox unavailable"}]
    [error] = result.errors
    assert error.code is ErrorCode.PARTIAL_DELIVERY and not error.retryable
    assert error.details == {"rejected_recipients": result.data["rejected_recipients"]}
    replay = await execute_approved(world, first)
    assert replay.status is Status.PARTIAL_SUCCESS and replay.meta.idempotency_replayed
    assert len(mail_server.received) == 1


async def test_server_down_then_the_same_approved_call_sends_once(world: World, mail_server: Any) -> None:
    first = await held(world)
    await approve(world, first)
    await mail_server.down()  # nothing listens there
    down = await execute_approved(world, first)
    assert down.error is not None and (down.error.code, down.error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, True)
    assert "nothing was sent" in down.error.message
    await mail_server.up()
    sent = await execute_approved(world, first)  # the key was released and the approval given back
    assert sent.status is Status.SUCCESS, sent
    assert len(mail_server.received) == 1


async def test_an_external_recipient_without_the_permission_is_refused(world: World, mail_server: Any) -> None:
    result = await world.agent.execute("send_email_preview", {**MAIL, "cc": [{"email": "bo@partner.org"}]})
    assert result.error is not None and result.error.code is ErrorCode.PERMISSION_DENIED
    assert result.error.message == ("sending to recipients outside the organization (partner.org) needs "
                                    "permission email:send_external")


async def test_the_external_permission_is_checked_again_when_sending(world: World, mail_server: Any) -> None:
    first = await held(world, {**MAIL, "cc": [{"email": "bo@partner.org"}]}, roles=("admin",))
    await approve(world, first)
    demoted = await execute_approved(world, first, roles=("developer",))  # alice lost the admin role since
    assert demoted.error is not None and demoted.error.code is ErrorCode.PERMISSION_DENIED
    assert demoted.error.details == {"external_domains": ["partner.org"]}
    assert mail_server.received == []


@pytest.mark.parametrize("email_config", [{"rules": {"blocked_domains": ["ops.example.com"], "max_recipients": 2}}],
                         indirect=True)
async def test_blocked_domains_and_too_many_recipients_are_refused(world: World, mail_server: Any) -> None:
    blocked = await world.agent.execute("send_email_preview", {**MAIL, "cc": [{"email": "x@ops.example.com"}]})
    assert blocked.error is not None and blocked.error.code is ErrorCode.POLICY_VIOLATION
    assert blocked.error.details == {"blocked_domains": ["ops.example.com"]}
    many = [{"email": f"u{i}@example.com"} for i in range(3)]
    crowded = await world.agent.execute("send_email_preview", {**MAIL, "recipients": many, "cc": []})
    assert crowded.error is not None and crowded.error.code is ErrorCode.POLICY_VIOLATION
    assert crowded.error.details == {"max_recipients": 2, "recipient_count": 3}
    assert mail_server.received == []


async def test_two_sidecars_sharing_the_drafts_send_one_approved_draft_once(
        configure: Configure, tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
        make_token: Callable[..., str], mail_server: Any) -> None:
    """Two replicas with stores of their own (no shared idempotency record): each holds the send of one draft,
    each approver approves it, and both execute at once. Only the plugin's draft store stands between them."""
    settings = make_settings(auth=jwt_auth, server={"listen": ["127.0.0.1:0"]})
    async with (gated(configure.tools(), settings, make_token, tmp_path / "a.db") as a,
                gated(configure.tools(), settings, make_token, tmp_path / "b.db") as b):
        on_a = await held(a)
        assert on_a.preview is not None
        preview_id = json.loads(on_a.preview.call_json)["arguments"]["preview_id"]
        on_b = await b.agent.execute("send_email", {"preview_id": preview_id}, idempotency_key=f"send-{preview_id}")
        assert on_b.status is Status.APPROVAL_REQUIRED, on_b
        await approve(a, on_a)
        await approve(b, on_b)
        results = await asyncio.gather(execute_approved(a, on_a), execute_approved(b, on_b))
    assert sorted(r.status for r in results) == [Status.ERROR, Status.SUCCESS], results
    [lost] = [r for r in results if r.error is not None]
    assert lost.error is not None and (lost.error.code, lost.error.details) in (
        (ErrorCode.OPERATION_IN_PROGRESS, {"state": "sending"}), (ErrorCode.INVALID_ARGUMENT, {"state": "sent"}))
    assert len(mail_server.received) == 1
