"""``send_email_preview`` (validate, render and keep a draft; sends nothing) and ``send_email`` (send exactly the
approved draft, once, over SMTP).

``send_email`` is ``external_irreversible``: the default approval policy holds it for a person, who sees its
rendering — the stored preview, with sender, recipients, subject and body — and at execution it sends
exactly that rendering (``ctx.approved_preview``), after checking that it is still the caller's unexpired
draft, unchanged, and that the rules and the external-recipient permission still allow it. The draft is
claimed with one atomic update, so no second call sends it, whatever its idempotency key. It is never
retried by the sidecar, and reports a failure as retryable only when certainly nothing was sent
(``toolbooth_email.delivery``).
"""

from __future__ import annotations

import logging
import secrets
import time

from sidecar.plugin import ErrorCode, Partial, RetryPolicy, SideEffect, ToolContext, ToolError, tool
from toolbooth_email.access import content_hash, find_draft, rfc3339, store_errors, unavailable_draft
from toolbooth_email.delivery import DeliveryUnknown, NotSent, TransportRefused, deliver
from toolbooth_email.drafts import Draft, DraftStore, DraftStoreError, State, open_drafts
from toolbooth_email.models import (
    EmailContent,
    Mailbox,
    SendEmailInput,
    SendEmailOutput,
    SendEmailPreviewInput,
    SendEmailPreviewOutput,
)
from toolbooth_email.rules import check_message, check_sender, deduplicated, warnings
from toolbooth_email.settings import EmailSettings

__all__ = ["render_send_email", "send_email", "send_email_preview"]

_MARGIN_SECONDS = 0.5  # of the call's deadline, kept to record how the transaction ended

log = logging.getLogger(__name__)

PREVIEW_DESCRIPTION = (
    "Check and render an email without sending it: normalizes the addresses, applies the organization's rules "
    "(blocked domains, recipient limit, external recipients) and returns the exact message with a preview_id, "
    "warnings and an expiry. Show it to the user; send it with send_email(preview_id)."
)
SEND_DESCRIPTION = (
    "Send exactly the email of a preview_id from send_email_preview, once. A person approves it first. "
    "The result lists accepted and rejected recipients separately. Never call it again for a message that was "
    "sent or whose delivery is unknown."
)


@tool(name="send_email_preview", version="1.0.0", side_effect=SideEffect.NONE, permissions=("email:preview_send",),
      timeout=2.0, retry=RetryPolicy(max_attempts=2, retry_on=(ErrorCode.SERVICE_UNAVAILABLE,)),
      description=PREVIEW_DESCRIPTION, title="Preview an email")
async def send_email_preview(args: SendEmailPreviewInput, ctx: ToolContext) -> SendEmailPreviewOutput:
    """Validate and render the email, keep it as the caller's draft and return it; send nothing."""
    settings = ctx.plugin_settings(EmailSettings)
    (recipients, cc, bcc), duplicates = deduplicated([args.recipients, args.cc, args.bcc])
    sender = Mailbox(email=settings.sender.email, display_name=settings.sender.display_name)
    content = EmailContent.model_validate({"from": sender, "recipients": recipients, "cc": cc, "bcc": bcc,
                                           "subject": args.subject, "body_text": args.body_text})
    check_message(content, settings.rules)
    check_sender(content, settings.rules, ctx.principal)
    now = time.time()
    expires = now + settings.draft_ttl_seconds
    preview = SendEmailPreviewOutput(preview_id=f"email_preview_{secrets.token_hex(16)}",
                                     preview_hash=content_hash(content), email=content,
                                     warnings=[*warnings(content, settings.rules), *duplicates],
                                     expires_at=rfc3339(expires))
    with store_errors():
        await open_drafts(settings).save(Draft(preview.preview_id, ctx.principal.tenant, ctx.principal.id,
                                               preview, now, expires))
    return preview


async def render_send_email(args: SendEmailInput, ctx: ToolContext) -> SendEmailPreviewOutput:
    """What ``send_email`` will send, for its approver: the caller's stored draft (no effect)."""
    store = open_drafts(ctx.plugin_settings(EmailSettings))
    draft = await find_draft(store, args.preview_id, ctx.principal, time.time())
    return draft.preview


@tool(name="send_email", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE, permissions=("email:send",),
      timeout=10.0, preview=render_send_email, description=SEND_DESCRIPTION, title="Send an email")
async def send_email(args: SendEmailInput, ctx: ToolContext) -> SendEmailOutput | Partial[SendEmailOutput]:
    """Send the approved draft once; report accepted and rejected recipients."""
    settings = ctx.plugin_settings(EmailSettings)
    store = open_drafts(settings)
    draft = await find_draft(store, args.preview_id, ctx.principal, time.time())
    message = _approved(draft, ctx, require_approval=settings.rules.require_approval)
    check_message(message.email, settings.rules)  # the rules and permissions of now, not of the preview
    check_sender(message.email, settings.rules, ctx.principal)
    key = ctx.idempotency_key or ctx.request_id
    with store_errors():
        if not await store.claim(draft.preview_id, key, time.time()):
            raise unavailable_draft(await store.get(draft.preview_id))
    try:
        delivery = await deliver(message.email, settings.smtp,
                                 timeout=min(settings.smtp.timeout_seconds, ctx.time_remaining() - _MARGIN_SECONDS))
    except NotSent as exc:
        await _record(store, draft.preview_id, key, "refused" if exc.refused else None)
        raise _not_sent(exc) from None
    except DeliveryUnknown as exc:
        ctx.logger.error("email preview %s: %s", draft.preview_id, exc)
        await _record(store, draft.preview_id, key, "unknown")
        raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, "the connection to the mail server failed while the message "
                        "was transferred: it may have been delivered, so it is not sent again",
                        retryable=False, safe_details={"state": "unknown"}) from None
    output = SendEmailOutput(preview_id=draft.preview_id, provider_message_id=delivery.message_id,
                             accepted_recipients=delivery.accepted, rejected_recipients=delivery.rejected,
                             sent_at=rfc3339(time.time()))
    await _record(store, draft.preview_id, key, "sent", output.model_dump_json())
    if not delivery.rejected:
        return output
    rejected = [r.model_dump() for r in delivery.rejected]
    return Partial(output, errors=[ToolError(
        ErrorCode.PARTIAL_DELIVERY, f"sent to {len(delivery.accepted)} recipient(s); the mail server refused "
        f"{len(delivery.rejected)}: {', '.join(r.email for r in delivery.rejected)}",
        safe_details={"rejected_recipients": rejected})])


def _approved(draft: Draft, ctx: ToolContext, *, require_approval: bool) -> SendEmailPreviewOutput:
    """The message to send: the rendering the approver approved, which must still be this draft's."""
    if ctx.approved_preview is None:
        if require_approval:
            raise ToolError(ErrorCode.APPROVAL_REQUIRED, "send_email sends only a preview a person approved; "
                            "nothing was sent", field="preview_id")
        return draft.preview
    message = SendEmailPreviewOutput.model_validate(ctx.approved_preview)
    if (message.preview_id != draft.preview_id or message.preview_hash != draft.preview.preview_hash
            or content_hash(message.email) != message.preview_hash):
        raise ToolError(ErrorCode.PERMISSION_DENIED, "the stored draft no longer matches the approved message; "
                        "nothing was sent", field="preview_id")
    return message


async def _record(store: DraftStore, preview_id: str, key: str, state: State | None,
                  result: str | None = None) -> None:
    """How the claimed draft ended (``None``: nothing was sent, give it back). A store failing now must not
    turn a known outcome into another: the draft then stays claimed, never sent again."""
    try:
        if state is None:
            await store.release(preview_id, key)
        else:
            await store.settle(preview_id, key, state, result)
    except DraftStoreError as exc:
        log.error("email preview %s: could not record its state %s: %s", preview_id, state or "pending", exc)


def _not_sent(exc: NotSent) -> ToolError:
    if exc.refused:
        details = {"state": "refused", "rejected_recipients": [r.model_dump() for r in exc.rejected]}
        return ToolError(ErrorCode.INVALID_ARGUMENT, f"{exc.reason}; nothing was sent (make a new preview)",
                         field="preview_id", safe_details=details)
    if isinstance(exc, TransportRefused):  # the server or the configuration must change: not retryable
        return ToolError(ErrorCode.SERVICE_UNAVAILABLE, exc.reason, retryable=False,
                         safe_details={"state": "pending", "transport": exc.cause})
    return ToolError(ErrorCode.SERVICE_UNAVAILABLE, f"{exc.reason}; nothing was sent", retryable=exc.retryable,
                     safe_details={"state": "pending"})
