"""Previews as the inbox shows them: who asked, when, in which conversation, and what the call will do.

``PreviewView.of`` reads a ``Preview`` (as ``ListPreviews`` returns it) into what the templates show. The
tool's rendering (``rendering_json``: the email with its recipients, subject and body, the task with its
project, assignee and due date), or the call's arguments for a tool without one, becomes a tree of
``Item``s: the headline fields first (subject, title, recipients, ...), long texts kept as written,
values the audit mask replaced (``hmac-sha256:…``) marked as masked and shown masked. Nothing here is HTML:
the templates escape every value.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.contract import Preview

__all__ = ["Item", "PreviewView", "items"]

MASKED_PREFIX = "hmac-sha256:"
_FIRST = ("title", "subject", "from", "sender", "to", "recipients", "cc", "bcc", "project", "assignee", "due_at",
          "priority", "body", "body_text", "text", "description", "body_html")
_LABELS = {"cc": "Cc", "bcc": "Bcc", "due_at": "Due", "body_text": "Body", "body_html": "Body (HTML, as text)",
           "expires_at": "Expires"}
_OUTCOMES = {"approved": "approved, not used yet", "used": "approved, and the call ran", "denied": "denied",
             "pending": "pending"}
_UNREADABLE = "this stored preview is not readable (it was changed in the store); it cannot be approved"
_LONG = 120  # characters: a longer string is shown as a block of text
_COMPACT_KEYS = 3  # a nested object of at most this many plain values is shown on one line
_ONE_LINE_ORDER = ("name", "title", "email", "code", "message", "id")


@dataclass(frozen=True, slots=True)
class Item:
    """One shown value: ``label``, then ``text`` (``block``: a long text kept as written; ``masked``) or
    ``children``."""

    label: str
    text: str | None = None
    children: tuple[Item, ...] = ()
    block: bool = False
    masked: bool = False


@dataclass(frozen=True, slots=True)
class PreviewView:
    """A pending preview for the templates."""

    preview_id: str
    preview_hash: str
    tool: str
    version: str
    requester: str  # for people: the id, and the tenant in brackets
    requester_id: str  # the requesting principal's id, as the inbox's filter names it
    conversation: str | None
    reason: str
    created_at: dt.datetime | None
    expires_at: dt.datetime
    approver_roles: tuple[str, ...]
    rendered: bool  # whether ``shown`` is the tool's rendering (else the call's arguments)
    shown: tuple[Item, ...]
    state: str
    decided_by: str | None = None
    decided_at: dt.datetime | None = None
    comment: str | None = None

    @classmethod
    def of(cls, preview: Preview) -> PreviewView:
        call = _object(preview.call_json)
        principal = call.get("principal") or {}
        requester_id = str(principal.get("id", "?"))
        requester = requester_id + (f" ({principal['tenant']})" if principal.get("tenant") else "")
        rendering = None if preview.rendering_json is None else _object(preview.rendering_json)
        shown = rendering if rendering is not None else call.get("arguments", call)
        return cls(preview_id=preview.preview_id, preview_hash=preview.preview_hash, tool=str(call.get("tool", "")),
                   version=str(call.get("version", "")), requester=requester, requester_id=requester_id,
                   conversation=call.get("conversation_id"), reason=preview.reason,
                   created_at=None if preview.created_at is None else _time(preview.created_at),
                   expires_at=_time(preview.expires_at), approver_roles=preview.approver_roles,
                   rendered=rendering is not None, shown=items(shown), state=preview.state.value,
                   decided_by=preview.decided_by, comment=preview.comment,
                   decided_at=None if preview.decided_at is None else _time(preview.decided_at))

    @property
    def outcome(self) -> str:
        """What became of a decided preview, for people."""
        return _OUTCOMES.get(self.state, self.state)

    def status(self, now: dt.datetime) -> str:
        """Its state, ``expired`` for a pending one past its expiry (it can no longer be decided)."""
        return "expired" if self.state == "pending" and self.expires_at <= now else self.state

    def expires_in(self, now: dt.datetime) -> str:
        """How long until it expires, for people (``expired`` once past)."""
        left = (self.expires_at - now).total_seconds()
        return "expired" if left <= 0 else _duration(left)

    def age(self, now: dt.datetime) -> str:
        """How long ago it was held, for people."""
        return "" if self.created_at is None else _duration((now - self.created_at).total_seconds())


def items(value: Any) -> tuple[Item, ...]:
    """The items of a JSON value as a top-level list of fields (an object's fields; else one item)."""
    if isinstance(value, Mapping):
        return tuple(_item(_label(key), value[key]) for key in _ordered(value))
    return (_item("Value", value),)


def _item(label: str, value: Any) -> Item:
    if isinstance(value, Mapping):
        if _compact(value):
            return Item(label, " · ".join(_text(value[key]) for key in _one_line(value)))
        return Item(label, children=tuple(_item(_label(key), value[key]) for key in _ordered(value)))
    if isinstance(value, Sequence) and not isinstance(value, str):
        if all(_plain(v) or _compact(v) for v in value):
            texts = [_text(v) if _plain(v) else " · ".join(_text(v[k]) for k in _one_line(v)) for v in value]
            return Item(label, ", ".join(texts) if texts else "none", masked=any(_masked(v) for v in value))
        return Item(label, children=tuple(_item(str(number), v) for number, v in enumerate(value, 1)))
    text = _text(value)
    return Item(label, text, block=len(text) > _LONG or "\n" in text, masked=_masked(value))


def _ordered(value: Mapping[str, Any]) -> list[str]:
    first = [key for key in _FIRST if key in value]
    return first + sorted(key for key in value if key not in _FIRST)


def _one_line(value: Mapping[str, Any]) -> list[str]:
    first = [key for key in _ONE_LINE_ORDER if key in value]
    return first + sorted(key for key in value if key not in _ONE_LINE_ORDER)


def _compact(value: Any) -> bool:
    return (isinstance(value, Mapping) and 0 < len(value) <= _COMPACT_KEYS
            and all(_plain(v) and len(_text(v)) <= _LONG for v in value.values()))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _masked(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(MASKED_PREFIX)


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _label(key: str) -> str:
    return _LABELS.get(key) or key.replace("_", " ").capitalize()


def _object(text: str) -> dict[str, Any]:
    """A stored JSON object; a stored text that is not one (changed in the store) reads as unreadable."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"unreadable": _UNREADABLE}


def _time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def _duration(seconds: float) -> str:
    minutes, _ = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else "under a minute"
