"""``send_email`` against a real SMTP server: exactly the approved message, once; accepted and rejected
recipients apart; what a failing server means for the draft; the checks made again at send time; the pair through
the test kit's gate."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from sidecar.plugin import ErrorCode, Partial, Principal, ToolError
from sidecar.plugin.fixtures import GateOpener
from sidecar.plugin.testing import Status
from toolbooth_email import PLUGIN, send_email, send_email_preview
from toolbooth_email.models import SendEmailInput, SendEmailOutput

from .conftest import ALICE, MAIL, Configure, DraftsDb, MailServer, draft, send, send_error, state

ADMIN = Principal(id="alice", tenant="acme", roles=("admin",))


async def test_sends_exactly_the_previewed_content_once(configure: Any, make_context: Any, mail_server: Any) -> None:
    approved = await draft(make_context)
    result = await send(make_context, approved)
    assert isinstance(result, SendEmailOutput)
    assert result.accepted_recipients == ["ana@example.com", "ops@example.com", "audit@example.com"]
    assert result.rejected_recipients == [] and result.preview_id == approved["preview_id"]
    [got] = mail_server.received
    assert got.mail_from == "toolbooth@example.com"
    assert got.rcpt_tos == ["ana@example.com", "ops@example.com", "audit@example.com"]
    message = got.message
    assert (message["To"], message["Cc"], message["Subject"]) == ("Ana Lima <ana@example.com>", "ops@example.com",
                                                                  "Deployment complete")
    assert message["Bcc"] is None and message["Message-ID"] == result.provider_message_id
    assert message.get_content().replace("\r\n", "\n") == "The new version has been deployed.\n"
    assert await state(configure, approved["preview_id"]) == "sent"
    again = await send_error(make_context, approved, key="key-2")  # another key: the draft is spent
    assert again.code is ErrorCode.INVALID_ARGUMENT and again.safe_details == {"state": "sent"}
    assert len(mail_server.received) == 1


async def test_a_concurrent_send_with_another_key_does_not_send_again(configure: Any, make_context: Any,
                                                                    mail_server: Any) -> None:
    mail_server.hold = True
    approved = await draft(make_context)
    first = asyncio.create_task(send(make_context, approved, key="key-1"))
    await asyncio.wait_for(mail_server.data_started.wait(), 5)  # the first call owns the draft, mid-DATA
    second = await send_error(make_context, approved, key="key-2")
    assert second.code is ErrorCode.OPERATION_IN_PROGRESS and second.safe_details == {"state": "sending"}
    mail_server.release.set()
    assert isinstance(await first, SendEmailOutput)
    assert len(mail_server.received) == 1 and await state(configure, approved["preview_id"]) == "sent"


async def test_two_sidecars_racing_to_send_one_draft_send_it_once(configure: Any, make_context: Any,
                                                                 mail_server: Any) -> None:
    approved = await draft(make_context)
    outcomes = await asyncio.gather(*(send(make_context, approved, key=f"key-{n}") for n in range(4)),
                                    return_exceptions=True)
    sent = [o for o in outcomes if isinstance(o, SendEmailOutput)]
    refused = [o for o in outcomes if isinstance(o, ToolError)]
    assert len(sent) == 1 and len(refused) == 3, outcomes
    for error in refused:  # still sending, or already sent: never a second message
        assert (error.code, error.safe_details) in ((ErrorCode.OPERATION_IN_PROGRESS, {"state": "sending"}),
                                                    (ErrorCode.INVALID_ARGUMENT, {"state": "sent"}))
    assert len(mail_server.received) == 1 and await state(configure, approved["preview_id"]) == "sent"


async def test_reports_accepted_and_rejected_recipients_separately(configure: Any, make_context: Any,
                                                                   mail_server: Any) -> None:
    mail_server.refuse = {"ops@example.com"}
    result = await send(make_context, await draft(make_context))
    assert isinstance(result, Partial) and isinstance(result.output, SendEmailOutput)
    assert result.output.accepted_recipients == ["ana@example.com", "audit@example.com"]
    assert [(r.email, r.reason) for r in result.output.rejected_recipients] == [
        ("ops@example.com", "550 5.1.1 mailbox unavailable")]
    [error] = result.errors
    assert error.code is ErrorCode.PARTIAL_DELIVERY
    assert error.safe_details == {"rejected_recipients": [{"email": "ops@example.com",
                                                           "reason": "550 5.1.1 mailbox unavailable"}]}
    [got] = mail_server.received
    assert got.rcpt_tos == ["ana@example.com", "audit@example.com"]


async def test_every_recipient_refused_sends_nothing_and_spends_the_draft(configure: Any, make_context: Any,
                                                                          mail_server: Any) -> None:
    mail_server.refuse = {"ana@example.com", "ops@example.com", "audit@example.com"}
    approved = await draft(make_context)
    error = await send_error(make_context, approved)
    assert error.code is ErrorCode.INVALID_ARGUMENT and "refused every recipient" in error.message
    assert error.safe_details is not None and error.safe_details["state"] == "refused"
    assert len(error.safe_details["rejected_recipients"]) == 3
    assert mail_server.received == [] and await state(configure, approved["preview_id"]) == "refused"


@pytest.mark.parametrize(("reply", "code", "retryable", "after"), [
    ("554 5.7.1 message refused as spam", ErrorCode.INVALID_ARGUMENT, False, "refused"),
    ("451 4.3.0 try again later", ErrorCode.SERVICE_UNAVAILABLE, True, "pending"),
])
async def test_a_refusal_of_the_data_is_known_to_have_sent_nothing(configure: Any, make_context: Any,
                                                                   mail_server: Any, reply: str, code: ErrorCode,
                                                                   retryable: bool, after: str) -> None:
    mail_server.data_reply = reply
    approved = await draft(make_context)
    error = await send_error(make_context, approved)
    assert (error.code, bool(error.retryable)) == (code, retryable) and reply in error.message
    assert "nothing was sent" in error.message
    assert mail_server.received == [] and await state(configure, approved["preview_id"]) == after


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_server_down_is_retryable_and_nothing_is_marked_sent(configure: Any, make_context: Any,
                                                                   mail_server: Any) -> None:
    approved = await draft(make_context)
    configure(smtp={"port": _closed_port()})
    error = await send_error(make_context, approved)
    assert (error.code, error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, True)
    assert "could not be reached" in error.message and "nothing was sent" in error.message
    assert await state(configure, approved["preview_id"]) == "pending"
    configure()  # the server is back: the same approved draft goes out, once
    result = await send(make_context, approved)
    assert isinstance(result, SendEmailOutput) and len(mail_server.received) == 1


async def test_prevents_duplicate_delivery_after_a_timeout(configure: Any, make_context: Any,
                                                           mail_server: Any) -> None:
    configure(smtp={"timeout_seconds": 0.3})
    mail_server.hold = True  # the server takes the message, but its reply never comes in time
    approved = await draft(make_context)
    error = await send_error(make_context, approved)
    assert (error.code, error.retryable) == (ErrorCode.SERVICE_UNAVAILABLE, False)
    assert "may have been delivered" in error.message and error.safe_details == {"state": "unknown"}
    assert await state(configure, approved["preview_id"]) == "unknown" and len(mail_server.received) == 1
    mail_server.release.set()
    again = await send_error(make_context, approved, key="key-2")
    assert again.code is ErrorCode.INVALID_ARGUMENT and again.safe_details == {"state": "unknown"}
    assert len(mail_server.received) == 1


async def test_does_not_allow_recipients_to_be_changed_during_execution(configure: Any, make_context: Any,
                                                                        mail_server: Any) -> None:
    approved = await draft(make_context)
    changed = {**approved, "email": {**approved["email"], "bcc": [{"email": "spy@example.com"}]}}
    error = await send_error(make_context, changed)
    assert error.code is ErrorCode.PERMISSION_DENIED and "no longer matches" in error.message
    other = await draft(make_context, {**MAIL, "subject": "Other"})
    swapped = {**other, "preview_id": approved["preview_id"]}  # another approved message for this draft
    assert (await send_error(make_context, swapped)).code is ErrorCode.PERMISSION_DENIED
    assert mail_server.received == [] and await state(configure, approved["preview_id"]) == "pending"


async def test_rechecks_external_recipient_policy_at_send_time(configure: Any, make_context: Any,
                                                               mail_server: Any) -> None:
    approved = await draft(make_context, {**MAIL, "cc": [{"email": "bo@partner.org"}]}, ADMIN)
    demoted = Principal(id="alice", tenant="acme", roles=("developer",))  # lost the role since the preview
    error = await send_error(make_context, approved, principal=demoted)
    assert error.code is ErrorCode.PERMISSION_DENIED and error.safe_details == {"external_domains": ["partner.org"]}
    configure(rules={"blocked_domains": ["partner.org"]})  # or the organization blocked the domain since
    blocked = await send_error(make_context, approved, principal=ADMIN)
    assert blocked.code is ErrorCode.POLICY_VIOLATION
    assert mail_server.received == [] and await state(configure, approved["preview_id"]) == "pending"


async def test_rejects_unapproved_previews(configure: Any, make_context: Any, mail_server: Any) -> None:
    approved = await draft(make_context)
    with pytest.raises(ToolError) as caught:
        await send_email(SendEmailInput(preview_id=approved["preview_id"]), make_context())
    assert caught.value.code is ErrorCode.APPROVAL_REQUIRED and mail_server.received == []
    configure(rules={"require_approval": False})  # an operator who lets the policy decide alone
    result = await send_email(SendEmailInput(preview_id=approved["preview_id"]), make_context())
    assert isinstance(result, SendEmailOutput) and len(mail_server.received) == 1


async def test_only_its_owner_sends_an_unexpired_draft(configure: Any, make_context: Any, mail_server: Any) -> None:
    approved = await draft(make_context)
    for stranger in (Principal(id="bob", tenant="acme"), Principal(id="alice", tenant="other")):
        error = await send_error(make_context, approved, principal=stranger)
        assert (error.code, error.field) == (ErrorCode.RESOURCE_NOT_FOUND, "preview_id")
    assert mail_server.received == []


async def test_an_expired_draft_is_not_sent(configure: Any, make_context: Any, mail_server: Any,
                                           drafts_db: DraftsDb) -> None:
    approved = await draft(make_context)
    drafts_db.execute("UPDATE email_drafts SET expires_at = 0")
    error = await send_error(make_context, approved)
    assert (error.code, error.field) == (ErrorCode.PREVIEW_EXPIRED, "preview_id")
    assert "make a new one" in error.message and mail_server.received == []


async def test_through_the_kits_gate_the_approved_draft_is_sent_once(configure: Configure, mail_server: MailServer,
                                                                    toolbooth_gate: GateOpener) -> None:
    gate = await toolbooth_gate(PLUGIN, plugin_name="email", plugin_settings=configure.section, principal=ALICE)
    previewed = await gate.call(send_email_preview, MAIL)
    assert previewed.status is Status.SUCCESS, previewed
    arguments = {"preview_id": previewed.data["preview_id"]}
    held = await gate.call(send_email, arguments, idempotency_key="send-1")
    assert held.status is Status.APPROVAL_REQUIRED and mail_server.received == []
    approval_id = await gate.approve(held)
    for _ in range(2):  # the second is the first's result, replayed
        sent = await gate.call(send_email, arguments, idempotency_key="send-1", approval_id=approval_id)
        assert sent.status is Status.SUCCESS, sent
    assert len(mail_server.received) == 1
