"""The string fields of every request: valid Unicode, no control characters, bounded in bytes.

Every string a caller sends, in any RPC, is checked by these rules before anything reads, decides
or stores it: a NUL fails a whole PostgreSQL write ("text fields cannot contain NUL"), a lone
surrogate cannot be encoded at all, a megabyte id would be stored verbatim. ``FIELDS`` holds the
rule of each field by name: an identifier holds no control character, free text (an approver's
``comment``, a denial's ``reason``) may hold line breaks and tabs but no other control character.

``ExecuteTool``'s fields are checked by the request stage (``stages/request.py``), which still audits
the refused call; every other RPC's by ``check_fields`` (an ``InvalidRequestError``, gRPC
INVALID_ARGUMENT) or ``malformed_field`` (a typed error, for the approval RPCs' results) before any
store or policy is asked, so that a refused request leaves nothing behind. The message is the
same everywhere: ``field_message``, naming the field.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from types import MappingProxyType

from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.errors import InvalidRequestError
from sidecar.tools.validation import valid_unicode

__all__ = ["FIELDS", "FieldRule", "check_fields", "field_message", "field_problem", "malformed_field"]

_TEXT_CONTROLS = frozenset("\t\n\r")


@dataclass(frozen=True, slots=True)
class FieldRule:
    """A field's bound in bytes of UTF-8, and whether it is free text (line breaks and tabs allowed)."""

    max_bytes: int
    text: bool = False

    def problem(self, value: str) -> str | None:
        """What is wrong with ``value`` under this rule, or ``None``."""
        if not valid_unicode(value):
            return "is not valid Unicode (a lone surrogate)"
        size = len(value.encode())
        if size > self.max_bytes:
            return f"is {size} bytes"
        if not value.isprintable() and any(unicodedata.category(char) == "Cc" and not (
                self.text and char in _TEXT_CONTROLS) for char in value):
            return "contains a control character"
        return None

    @property
    def described(self) -> str:
        """The rule in words, for the message."""
        if self.text:
            return (f"at most {self.max_bytes} bytes of UTF-8, without control characters other than line breaks "
                    "and tabs")
        return (f"1-{self.max_bytes} characters and at most {self.max_bytes} bytes of UTF-8, without control "
                "characters")


_ID = FieldRule(256)
_TEXT = FieldRule(4096, text=True)
FIELDS = MappingProxyType({
    "tool": FieldRule(128), "idempotency_key": _ID, "call_id": _ID, "conversation_id": _ID, "approval_id": _ID,
    "request_id": _ID, "preview_id": _ID, "preview_hash": _ID, "comment": _TEXT, "reason": _TEXT,
})


def field_problem(name: str, value: str) -> str | None:
    """What is wrong with ``value`` as the field ``name`` (a key of ``FIELDS``), or ``None``."""
    return FIELDS[name].problem(value)


def field_message(name: str, problem: str) -> str:
    """The message a caller gets for the field ``name`` with ``problem``."""
    return f"{name} {problem}: it must be {FIELDS[name].described}"


def malformed_field(**values: str | None) -> ErrorInfo | None:
    """``INVALID_ARGUMENT`` naming the first malformed field of ``values`` (by field name; ``None``: absent),
    or ``None`` when all are well formed."""
    for name, value in values.items():
        if value is not None and (problem := field_problem(name, value)) is not None:
            return ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, field_message(name, problem), field=name)
    return None


def check_fields(**values: str | None) -> None:
    """Raise ``InvalidRequestError`` with the message of the first malformed field of ``values``."""
    if (error := malformed_field(**values)) is not None:
        raise InvalidRequestError(error.message)
