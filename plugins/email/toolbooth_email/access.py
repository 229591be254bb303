"""Finding a caller's draft and saying, as a typed error, why it cannot be rendered or sent.

A draft of another principal or tenant looks like one that does not exist (``RESOURCE_NOT_FOUND``); an
expired one is ``PREVIEW_EXPIRED``; one that a call already claimed says where it is in its life
(``safe_details.state``), so that the model knows whether the message went out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import rfc8785

from sidecar.plugin import ErrorCode, Principal, ToolError
from toolbooth_email.drafts import Draft, DraftStore, DraftStoreError
from toolbooth_email.models import EmailContent

__all__ = ["content_hash", "find_draft", "rfc3339", "store_errors", "unavailable_draft"]


def content_hash(content: EmailContent) -> str:
    """``sha256:`` and the hex digest of the message's canonical JSON (RFC 8785): stable for one message."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(content.model_dump(mode="json"))).hexdigest()


def rfc3339(timestamp: float) -> str:
    """A Unix time as RFC 3339 UTC, to the second."""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@contextmanager
def store_errors() -> Iterator[None]:
    """A failing draft store as ``SERVICE_UNAVAILABLE`` (retryable: nothing was sent)."""
    try:
        yield
    except DraftStoreError:
        raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, "the email draft store is unavailable; nothing was sent",
                        retryable=True) from None


async def find_draft(store: DraftStore, preview_id: str, principal: Principal, now: float) -> Draft:
    """The caller's pending, unexpired draft ``preview_id``; else the error that says why not."""
    with store_errors():
        draft = await store.get(preview_id)
    if draft is None or (draft.tenant, draft.principal_id) != (principal.tenant, principal.id):
        raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, "no email preview with this preview_id; "
                        "make one with send_email_preview", field="preview_id")
    if draft.state != "pending":
        raise unavailable_draft(draft)
    if draft.expires_at <= now:
        raise ToolError(ErrorCode.PREVIEW_EXPIRED, f"the email preview expired at {rfc3339(draft.expires_at)}; "
                        "make a new one with send_email_preview", field="preview_id")
    return draft


def unavailable_draft(draft: Draft | None) -> ToolError:
    """Why a draft that another call claimed is not sent (again)."""
    if draft is None:
        return ToolError(ErrorCode.RESOURCE_NOT_FOUND, "no email preview with this preview_id", field="preview_id")
    if draft.state == "sending":
        return ToolError(ErrorCode.OPERATION_IN_PROGRESS, "another call is sending this preview, or stopped while "
                         "sending it; it is never sent twice", field="preview_id", safe_details={"state": "sending"})
    if draft.state == "pending":  # lost the claim to expiry
        return ToolError(ErrorCode.PREVIEW_EXPIRED, "the email preview expired; make a new one with "
                         "send_email_preview", field="preview_id")
    said = {
        "sent": "was already sent; it is never sent twice (make a new preview to send another message)",
        "refused": "was refused by the mail server; nothing was sent (make a new preview)",
        "unknown": "may have been delivered: the connection failed during the transfer; it is not sent again",
    }[draft.state]
    return ToolError(ErrorCode.INVALID_ARGUMENT, f"this email preview {said}", field="preview_id",
                     safe_details={"state": draft.state})
