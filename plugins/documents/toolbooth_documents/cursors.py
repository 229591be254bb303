"""Opaque, signed cursors: where a search page or a read ended, bound to what it was issued for.

A cursor is ``v1.<payload>.<mac>`` (URL-safe base64): the payload is where to go on from, the MAC
(HMAC-SHA256 with the index's cursor key, cut to 16 bytes) makes it unforgeable. A search cursor
carries a keyed digest of its scope — the tenant, the query and the project — so that it only reads
on the same search (not bound to ``limit``: a page may be any size); a read cursor carries the
document id and version, so that it only reads on the same version of the same document. The
same position in the same scope always gives the same cursor. ``CursorError`` says, in words for
the model, why a cursor cannot be used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from toolbooth_documents.records import After

__all__ = ["MAX_CURSOR_CHARS", "CursorError", "Cursors", "SearchScope"]

MAX_CURSOR_CHARS = 256
_PREFIX = "v1"
_MAC_BYTES = 16
_SEARCH, _READ = "s", "r"


class CursorError(ValueError):
    """A cursor that cannot be used here; the message says why and what to do instead."""


@dataclass(frozen=True, slots=True)
class SearchScope:
    """What a search's results depend on: a cursor reads on only the search it was issued for."""

    tenant: str
    query: str
    project_id: str | None


@dataclass(frozen=True, slots=True)
class Cursors:
    """Issues and checks cursors with one key."""

    key: bytes

    def search(self, scope: SearchScope, after: After) -> str:
        """The cursor of the search page after ``after``."""
        return self._seal([_SEARCH, self._scope_tag(scope), after.score, after.document_id])

    def open_search(self, cursor: str, scope: SearchScope) -> After:
        """Where the page of ``cursor`` starts, if it was issued for ``scope``."""
        payload = self._open(cursor, _SEARCH, "search_documents")
        match payload:
            case [_, str(tag), int() | float() as score, str(last)] if not isinstance(score, bool):
                if not hmac.compare_digest(tag, self._scope_tag(scope)):
                    raise CursorError("this cursor belongs to another search: use a cursor only with the query "
                                      "and project_id it was returned for, or search again without one")
                return After(float(score), last)
        raise _not_ours()

    def read(self, document_id: str, version: int, offset: int) -> str:
        """The cursor reading version ``version`` of ``document_id`` on from character ``offset``."""
        return self._seal([_READ, document_id, version, offset])

    def open_read(self, cursor: str, document_id: str) -> tuple[int, int]:
        """The document version and character offset of ``cursor``, if it was issued for ``document_id``."""
        payload = self._open(cursor, _READ, "read_document")
        match payload:
            case [_, str(issued_for), int(version), int(offset)] if offset >= 0 and version >= 1:
                if issued_for != document_id:
                    raise CursorError(f"this cursor belongs to document {issued_for}, not {document_id}: "
                                      "read a document with its own cursor, or from the start without one")
                return version, offset
        raise _not_ours()

    def _seal(self, payload: list[Any]) -> str:
        body = json.dumps(payload, separators=(",", ":")).encode()
        return ".".join((_PREFIX, _b64(body), _b64(self._mac(body))))

    def _open(self, cursor: str, kind: str, tool: str) -> list[Any]:
        parts = cursor.split(".")
        if len(parts) != 3 or parts[0] != _PREFIX:
            raise _not_ours()
        try:
            body, mac = _unb64(parts[1]), _unb64(parts[2])
        except (binascii.Error, ValueError):
            raise _not_ours() from None
        if not hmac.compare_digest(mac, self._mac(body)):
            raise _not_ours()
        payload = json.loads(body)  # signed by us: valid JSON
        if not isinstance(payload, list) or not payload:
            raise _not_ours()
        if payload[0] != kind:
            other = "read_document" if payload[0] == _READ else "search_documents"
            raise CursorError(f"this is a cursor of {other}; {tool} takes only the cursors it returned")
        return payload

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self.key, b"cursor\0" + body, hashlib.sha256).digest()[:_MAC_BYTES]

    def _scope_tag(self, scope: SearchScope) -> str:
        canonical = json.dumps(["search-scope", scope.tenant, scope.query, scope.project_id]).encode()
        return hmac.new(self.key, canonical, hashlib.sha256).hexdigest()[:16]


def _not_ours() -> CursorError:
    return CursorError("not a valid cursor: pass next_cursor exactly as it was returned, or leave cursor out "
                       "to start from the beginning")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text or any(c not in _ALPHABET for c in text):
        raise ValueError("not URL-safe base64")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
