"""One SMTP transaction with ``aiosmtplib``: connect (TLS or STARTTLS, login), MAIL, one RCPT per recipient,
DATA — and a precise account of what happened.

The connection is as secure as ``smtp.security`` says, or nothing is sent: ``tls`` speaks TLS from the first
byte; ``starttls`` upgrades before anything else, and a server that does not offer STARTTLS gets no message
in clear; the certificate is verified (``smtp.validate_certs``, against ``smtp.cert_bundle`` or the system's
CAs). Credentials are sent only over TLS, or in clear to a loopback relay when ``smtp.allow_plaintext_login``
says so. A connection that cannot be made that secure is ``TransportRefused``: nothing was sent, and trying
again will not help until the server or the configuration changes.

What can be known about a failure decides what may happen next:

- **Before DATA** (connecting, TLS, login, MAIL, RCPT) nothing was handed over: the server has no message.
  ``NotSent``: retryable when the cause is temporary (a connection refused or lost, a timeout, a 4xx reply).
- **A reply to DATA** that is not 250 (or a refusal of the DATA command itself) is the server saying it did
  not take the message: ``NotSent`` too (4xx temporary, 5xx refused).
- **The connection fails or times out once DATA began** (the content may be on its way, or the server may
  have taken it and its 250 been lost): ``DeliveryUnknown``. It may have been delivered: never send it again
  blindly.
- Only some recipients refused at RCPT: the message goes to the others, and ``Delivery.rejected`` names
  the refused ones with the server's reply.
"""

from __future__ import annotations

import asyncio
import email.policy
import ssl
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from typing import Literal

import aiosmtplib
from email_validator import validate_email

from toolbooth_email.models import EmailContent, Mailbox, RejectedRecipient
from toolbooth_email.settings import SmtpSettings

__all__ = ["Delivery", "DeliveryUnknown", "Insecurity", "NotSent", "TransportRefused", "build_message", "deliver"]

Insecurity = Literal["starttls_not_offered", "certificate_untrusted", "tls_failed", "login_in_clear"]
"""Why a connection was not secure enough to send over (``details.transport`` of the tool's error)."""

_MAX_REASON = 300
_QUIT_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """The server took the message for ``accepted`` (and refused it for ``rejected``)."""

    message_id: str
    accepted: list[str]
    rejected: list[RejectedRecipient]


class NotSent(Exception):
    """Certainly nothing was sent. ``retryable``: the same message may be sent later (a temporary cause);
    ``refused``: the server refused this message or all its recipients (sending it again will not help)."""

    def __init__(self, reason: str, *, retryable: bool, refused: bool = False,
                 rejected: list[RejectedRecipient] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.refused = refused
        self.rejected = rejected or []


class TransportRefused(NotSent):
    """The connection could not be made as secure as configured (``cause``); nothing was sent (not retryable)."""

    def __init__(self, reason: str, cause: Insecurity) -> None:
        super().__init__(reason, retryable=False)
        self.cause = cause


class DeliveryUnknown(Exception):
    """The transfer of the message began and did not end with a reply: it may have been delivered."""


@dataclass(slots=True)
class _Transaction:
    data_started: bool = False
    accepted: list[str] = field(default_factory=list)
    rejected: list[RejectedRecipient] = field(default_factory=list)


def _ascii(address: str) -> str | None:
    return validate_email(address, check_deliverability=False).ascii_email


def build_message(content: EmailContent, message_id: str) -> tuple[EmailMessage, bool]:
    """The message as sent (no Bcc header), and whether it needs SMTPUTF8 (a non-ASCII local part)."""
    boxes = [content.from_, *content.recipients, *content.cc, *content.bcc]
    utf8 = any(_ascii(box.email) is None for box in boxes)
    message = EmailMessage(policy=email.policy.SMTPUTF8 if utf8 else email.policy.SMTP)

    def shown(items: list[Mailbox]) -> str:
        return ", ".join(formataddr((box.display_name or "", box.email if utf8 else _ascii(box.email) or ""))
                         for box in items)

    message["From"] = shown([content.from_])
    message["To"] = shown(content.recipients)
    if content.cc:
        message["Cc"] = shown(content.cc)
    message["Subject"] = content.subject
    message["Message-ID"] = message_id
    message["Date"] = formatdate(localtime=False, usegmt=True)
    message.set_content(content.body_text, cte="quoted-printable")
    return message, utf8


async def deliver(content: EmailContent, smtp: SmtpSettings, *, timeout: float) -> Delivery:
    """Send ``content`` once through ``smtp`` within ``timeout`` seconds; raise ``NotSent`` or
    ``DeliveryUnknown`` as the module docstring says."""
    sender_domain = (_ascii(content.from_.email) or content.from_.email).rpartition("@")[2]
    message_id = make_msgid(domain=sender_domain)
    message, utf8 = build_message(content, message_id)
    options = ["SMTPUTF8"] if utf8 else []
    envelope = [address if utf8 else _ascii(address) or address for address in content.envelope()]
    sender = content.from_.email if utf8 else _ascii(content.from_.email) or content.from_.email
    client = aiosmtplib.SMTP(  # STARTTLS and login are done by _open, which checks each step
        hostname=smtp.host, port=smtp.port, use_tls=smtp.security == "tls", start_tls=False,
        timeout=smtp.timeout_seconds, validate_certs=smtp.validate_certs,
        cert_bundle=str(smtp.cert_bundle) if smtp.cert_bundle else None)
    transaction = _Transaction()
    try:
        async with asyncio.timeout(timeout):
            await _open(client, smtp)
            await _transfer(client, sender, envelope, content.envelope(), message.as_bytes(), options, transaction)
    except (NotSent, DeliveryUnknown):
        raise
    except aiosmtplib.SMTPResponseException as exc:
        if transaction.data_started:  # a reply to DATA: the server did not take the message
            raise NotSent(f"the mail server refused the message: {_reason(exc)}", retryable=_temporary(exc),
                          refused=not _temporary(exc)) from None
        raise NotSent(f"the mail server refused the session: {_reason(exc)}", retryable=_temporary(exc)) from None
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        if transaction.data_started:
            raise DeliveryUnknown(f"the connection failed while the message was transferred: {exc!r}") from None
        raise NotSent(f"the mail server could not be reached: {type(exc).__name__}", retryable=True) from None
    finally:
        await _quit(client)
    return Delivery(message_id, transaction.accepted, transaction.rejected)


async def _open(client: aiosmtplib.SMTP, smtp: SmtpSettings) -> None:
    """Connect, secured as ``smtp.security`` says, and log in; ``TransportRefused`` when that cannot be done."""
    try:
        await client.connect()
        if smtp.security == "starttls":
            await client.ehlo()
            if not client.supports_extension("starttls"):
                raise TransportRefused(f"the mail server {smtp.host} does not offer STARTTLS, which smtp.security "
                                       "requires; nothing was sent in clear", "starttls_not_offered")
            await client.starttls()
    except (aiosmtplib.SMTPException, OSError) as exc:
        if (refused := _tls_refusal(exc, smtp.host)) is not None:
            raise refused from None
        raise
    if smtp.username is None:
        return
    if client.get_transport_info("sslcontext") is None and not smtp.allow_plaintext_login:  # (loopback only)
        raise TransportRefused(f"the connection to {smtp.host} is not encrypted, and credentials are sent only over "
                               "TLS (smtp.security); nothing was sent", "login_in_clear")
    await client.login(smtp.username, smtp.password.get_secret_value() if smtp.password else "")


def _tls_refusal(exc: BaseException, host: str) -> TransportRefused | None:
    """The TLS failure behind ``exc`` (aiosmtplib wraps the handshake's error of implicit TLS), if it is one."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return TransportRefused(f"the certificate of the mail server {host} is not trusted "
                                f"({cause.verify_message}); nothing was sent", "certificate_untrusted")
    if isinstance(cause, ssl.SSLError):
        return TransportRefused(f"TLS with the mail server {host} failed ({cause.reason or type(cause).__name__}); "
                                "nothing was sent", "tls_failed")
    return None


async def _transfer(client: aiosmtplib.SMTP, sender: str, envelope: list[str], shown: list[str], data: bytes,
                    options: list[str], transaction: _Transaction) -> None:
    await client.mail(sender, options=options, encoding="utf-8" if options else "ascii")
    for address, listed in zip(envelope, shown, strict=True):
        try:
            await client.rcpt(address, encoding="utf-8" if options else "ascii")
        except aiosmtplib.SMTPRecipientRefused as exc:
            transaction.rejected.append(RejectedRecipient(email=listed, reason=_reason(exc)))
        else:
            transaction.accepted.append(listed)
    if not transaction.accepted:
        temporary = all(reason.reason.startswith("4") for reason in transaction.rejected)
        raise NotSent("the mail server refused every recipient", retryable=temporary, refused=not temporary,
                      rejected=transaction.rejected)
    transaction.data_started = True
    await client.data(data)


async def _quit(client: aiosmtplib.SMTP) -> None:
    if not client.is_connected:
        return
    try:  # after the transaction: its outcome is known, a failing QUIT changes nothing
        async with asyncio.timeout(_QUIT_SECONDS):
            await client.quit()
    except (aiosmtplib.SMTPException, OSError, TimeoutError):
        client.close()


def _temporary(exc: aiosmtplib.SMTPResponseException) -> bool:
    return 400 <= exc.code < 500


def _reason(exc: aiosmtplib.SMTPResponseException) -> str:
    text = " ".join(f"{exc.code} {exc.message}".split())
    return text[:_MAX_REASON]
