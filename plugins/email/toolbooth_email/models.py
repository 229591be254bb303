"""Input and output models of ``send_email_preview`` and ``send_email``; their JSON schemas are what the model sees.

Addresses are validated and normalized by ``email-validator`` while the arguments are validated (domain
lower-cased and IDNA-normalized, the local part kept as written, surrounding spaces dropped), so the
policies, the draft and the message all see the same normalized address.
"""

from __future__ import annotations

from typing import Annotated

from email_validator import EmailNotValidError, validate_email
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "MAX_LISTED",
    "Address",
    "EmailContent",
    "Mailbox",
    "PreviewWarning",
    "RejectedRecipient",
    "SendEmailInput",
    "SendEmailOutput",
    "SendEmailPreviewInput",
    "SendEmailPreviewOutput",
    "normalized_address",
]

MAX_LISTED = 1000
"""Most addresses one list may hold before the policy's own limit (``rules.max_recipients``) is checked."""


def normalized_address(value: str) -> str:
    """``value`` as a normalized address; ``ValueError`` (shown with the field) when it is not one."""
    try:
        return validate_email(value.strip(), check_deliverability=False).normalized
    except EmailNotValidError as exc:
        raise ValueError(f"not a valid email address: {exc}") from None


def _one_line(value: str) -> str:
    if any(not ch.isprintable() for ch in value):
        raise ValueError("must be printable text on one line (no line breaks or control characters)")
    if not value.strip():
        raise ValueError("must not be blank")
    return value.strip()


def _text(value: str) -> str:
    if any(not ch.isprintable() and ch not in "\n\t" for ch in value):
        raise ValueError("must be text: line breaks and tabs are fine, other control characters are not")
    if not value.strip():
        raise ValueError("must not be blank")
    return value


Address = Annotated[str, Field(min_length=3, max_length=320), AfterValidator(normalized_address)]
DisplayName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_one_line)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Mailbox(_Model):
    """One address, with the name shown next to it."""

    email: Address = Field(description="An email address, e.g. ana@example.com.")
    display_name: DisplayName | None = Field(default=None, description="The name shown with the address.")


_LIST_HELP = "Addresses of {}; normalized, duplicates across recipients, cc and bcc are dropped with a warning."


class SendEmailPreviewInput(_Model):
    """An email to validate, render and keep as a draft."""

    recipients: list[Mailbox] = Field(min_length=1, max_length=MAX_LISTED, description=_LIST_HELP.format("To"))
    cc: list[Mailbox] = Field(default=[], max_length=MAX_LISTED, description=_LIST_HELP.format("Cc"))
    bcc: list[Mailbox] = Field(default=[], max_length=MAX_LISTED,
                               description=_LIST_HELP.format("Bcc (not shown to the other recipients)"))
    subject: Annotated[str, Field(min_length=1, max_length=250), AfterValidator(_one_line)] = Field(
        description="The subject line: one line of text.")
    body_text: Annotated[str, Field(min_length=1, max_length=100_000), AfterValidator(_text)] = Field(
        description="The plain-text body.")


class EmailContent(BaseModel):
    """The exact message: sender, recipients, subject and body."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    from_: Mailbox = Field(alias="from")
    recipients: list[Mailbox]
    cc: list[Mailbox]
    bcc: list[Mailbox]
    subject: str
    body_text: str

    def envelope(self) -> list[str]:
        """Every address the message goes to, in order: recipients, cc, bcc."""
        return [box.email for box in (*self.recipients, *self.cc, *self.bcc)]


class PreviewWarning(_Model):
    """Something the sender should know before approving."""

    code: str
    message: str


class SendEmailPreviewOutput(_Model):
    """A stored draft: what ``send_email(preview_id)`` would send, with its hash, warnings and expiry.

    It is also the rendering an approver sees for ``send_email``."""

    preview_id: str = Field(description="Pass it to send_email to send exactly this message.")
    preview_hash: str = Field(description="sha256: of the canonical JSON (RFC 8785) of `email`.")
    email: EmailContent
    warnings: list[PreviewWarning]
    expires_at: str = Field(description="RFC 3339 UTC; after it the draft can no longer be sent.")


class SendEmailInput(_Model):
    """Which draft to send."""

    preview_id: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_-]+$",
                            description="The preview_id send_email_preview returned.")


class RejectedRecipient(_Model):
    """A recipient the mail server refused."""

    email: str
    reason: str


class SendEmailOutput(_Model):
    """What the mail server accepted. (Whether this result is a replay is ``meta.idempotency_replayed``.)"""

    preview_id: str
    provider_message_id: str = Field(description="The Message-ID of the sent message.")
    accepted_recipients: list[str]
    rejected_recipients: list[RejectedRecipient]
    sent_at: str = Field(description="RFC 3339 UTC.")
