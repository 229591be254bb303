"""Tools of the result contract's tests: typed errors with safe details, partial results, pages, retries
of a hung read, and a preview/commit pair whose commit an approver approves from the tool's rendering.

``send_email_preview`` stores a draft (``DRAFTS``) and returns its id; ``send_email(preview_id)`` needs
approval (external and irreversible), is rendered from the draft for its approver, and "sends" exactly
the approved rendering (``SENT``) — never the draft as it is at execution.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from pydantic import BaseModel, ConfigDict, Field

from sidecar.plugin import ErrorCode, Partial, RetryPolicy, SideEffect, ToolContext, ToolError, tool
from tests.support.tools import Counter, Text

__all__ = ["ALL", "DELIVERIES", "DRAFTS", "HUNG", "OCCUPIED", "RELEASE", "SENT", "UNAVAILABLE_WRITES"]


class Recipient(BaseModel):
    model_config = ConfigDict(extra="forbid")
    email: str
    display_name: str | None = None


class Mail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recipients: list[Recipient] = Field(min_length=1)
    cc: list[Recipient] = []
    subject: str = Field(min_length=1)
    body_text: str = Field(min_length=1)


class Draft(BaseModel):
    preview_id: str


class Delivered(BaseModel):
    accepted: list[str]


@tool(name="check_mail", version="1.0.0", side_effect=SideEffect.NONE)
async def check_mail(args: Mail, ctx: ToolContext) -> Draft:
    """Refuse a blocked domain with POLICY_VIOLATION and safe details; the cause's text stays in the log."""
    blocked = sorted({r.email.split("@")[-1] for r in args.recipients if r.email.endswith("@blocked.test")})
    try:
        raise ConnectionError("directory password=hunter2 rejected")
    except ConnectionError as cause:
        raise ToolError(ErrorCode.POLICY_VIOLATION, "a recipient's domain is blocked",
                        safe_details={"blocked_domains": blocked}) from cause


class Unknown(BaseModel):
    code: str


@tool(name="raise_code", version="1.0.0", side_effect=SideEffect.NONE)
async def raise_code(args: Unknown, ctx: ToolContext) -> Draft:
    """Raise a ToolError with ``code``: one of the set reaches the caller, any other is an INTERNAL_ERROR."""
    raise ToolError(args.code, f"failed with {args.code}", safe_details={"code": args.code})


DELIVERIES = Counter()


@tool(name="deliver", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
async def deliver(args: Mail, ctx: ToolContext) -> Delivered | Partial[Delivered]:
    """Deliver to every recipient but those at refused.test: a partial delivery names the refused ones."""
    DELIVERIES.bump()
    accepted = [r.email for r in args.recipients if not r.email.endswith("@refused.test")]
    refused = [r.email for r in args.recipients if r.email.endswith("@refused.test")]
    if not refused:
        return Delivered(accepted=accepted)
    return Partial(Delivered(accepted=accepted), errors=[
        ToolError(ErrorCode.PARTIAL_DELIVERY, f"{len(refused)} recipient(s) refused by the server",
                  safe_details={"rejected": [{"email": email, "reason": "550 mailbox unavailable"}
                                             for email in refused]}),
    ])


class Search(BaseModel):
    query: str
    cursor: str | None = None


class Hits(BaseModel):
    items: list[str]
    next_cursor: str | None = None
    has_more: bool


PAGES = {None: (["a", "b"], "page-2"), "page-2": (["c"], None)}


@tool(name="search_pages", version="1.0.0", side_effect=SideEffect.NONE)
async def search_pages(args: Search, ctx: ToolContext) -> Hits:
    """Two pages of hits; the output's next_cursor and has_more are mirrored into meta."""
    items, cursor = PAGES[args.cursor]
    return Hits(items=items, next_cursor=cursor, has_more=cursor is not None)


class Page(BaseModel):
    content: str
    truncated: bool
    next_cursor: str | None = None


@tool(name="read_page", version="1.0.0", side_effect=SideEffect.NONE)
async def read_page(args: Text, ctx: ToolContext) -> Page:
    """Return at most 5 characters of ``text``, saying so when it cut."""
    cut = len(args.text) > 5
    return Page(content=args.text[:5], truncated=cut, next_cursor="5" if cut else None)


class Hung:
    """The attempts of ``hangs_once``: the first waits until it is cancelled; ``cancelled`` counts that."""

    def __init__(self) -> None:
        self.attempts, self.cancelled = Counter(), Counter()


HUNG = Hung()


@tool(name="hangs_once", version="1.0.0", side_effect=SideEffect.NONE, timeout=10,
      retry=RetryPolicy(max_attempts=2, attempt_timeout=0.3, initial_backoff=0.001,
                        retry_on=(ErrorCode.TIMEOUT, ErrorCode.SERVICE_UNAVAILABLE)))
async def hangs_once(args: Text, ctx: ToolContext) -> Text:
    """The first attempt hangs (a search service that never answers); the retry answers at once."""
    if HUNG.attempts.bump() == 1:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            HUNG.cancelled.bump()
            raise
    return Text(text=f"{args.text} on attempt {ctx.attempt}")


OCCUPIED, RELEASE = Counter(), threading.Event()


@tool(name="occupy", version="1.0.0", side_effect=SideEffect.NONE, timeout=10)
def occupy(args: Text, ctx: ToolContext) -> Text:
    """A sync read that holds its thread until the test sets ``RELEASE``."""
    OCCUPIED.bump()
    RELEASE.wait(timeout=ctx.time_remaining())
    return args


@tool(name="queued_read", version="1.0.0", side_effect=SideEffect.NONE, timeout=10,
      retry=RetryPolicy(max_attempts=2, attempt_timeout=0.2, retry_on=(ErrorCode.TIMEOUT,)))
def queued_read(args: Text, ctx: ToolContext) -> Text:
    """A sync read with short attempts: an attempt still waiting for a thread at its deadline never ran."""
    return Text(text=f"{args.text} on attempt {ctx.attempt}")


UNAVAILABLE_WRITES = Counter()


@tool(name="write_unavailable", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
async def write_unavailable(args: Text, ctx: ToolContext) -> Text:
    """A write whose backend is unavailable: never retried by the sidecar."""
    UNAVAILABLE_WRITES.bump()
    raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, "the task service is unavailable")


DRAFTS: dict[str, dict[str, object]] = {}
SENT: list[dict[str, object]] = []
_draft_ids = itertools.count(1)


class MailRendering(BaseModel):
    to: list[str]
    cc: list[str]
    subject: str
    body: str


@tool(name="send_email_preview", version="1.0.0", side_effect=SideEffect.NONE, permissions=("email:preview_send",))
async def send_email_preview(args: Mail, ctx: ToolContext) -> Draft:
    """Store a draft and return its id; sends nothing."""
    preview_id = f"draft-{next(_draft_ids)}"
    DRAFTS[preview_id] = {"to": [r.email.lower() for r in args.recipients], "cc": [r.email.lower() for r in args.cc],
                          "subject": args.subject, "body": args.body_text}
    return Draft(preview_id=preview_id)


def render_email(args: Draft, ctx: ToolContext) -> MailRendering:
    """What ``send_email`` will send: the draft ``preview_id`` names (a sync renderer)."""
    draft = DRAFTS.get(args.preview_id)
    if draft is None:
        raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, "no draft with this preview_id", field="preview_id")
    return MailRendering.model_validate(draft)


class SentMail(BaseModel):
    sent_to: list[str]
    subject: str


@tool(name="send_email", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE, permissions=("email:send",),
      preview=render_email)
async def send_email(args: Draft, ctx: ToolContext) -> SentMail:
    """Send exactly the approved rendering of the draft."""
    if ctx.approved_preview is None:
        raise ToolError(ErrorCode.APPROVAL_REQUIRED, "sending needs an approved preview")
    SENT.append(ctx.approved_preview)
    mail = MailRendering.model_validate(ctx.approved_preview)
    return SentMail(sent_to=mail.to + mail.cc, subject=mail.subject)


async def render_broken(args: Draft, ctx: ToolContext) -> dict[str, object]:
    raise RuntimeError("renderer secret=hunter2")


@tool(name="broken_preview", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE, preview=render_broken)
async def broken_preview(args: Draft, ctx: ToolContext) -> SentMail:
    """Its renderer fails: its calls never get a preview."""
    raise AssertionError("must never run")


ALL = [check_mail, raise_code, deliver, search_pages, read_page, hangs_once, occupy, queued_read, write_unavailable,
       send_email_preview, send_email, broken_preview]
