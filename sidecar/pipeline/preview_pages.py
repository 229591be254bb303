"""Pages of previews (``ListPreviews``, the inbox): a page, and the opaque token of where the next one starts.

A token holds a place in the listing, newest first (``PreviewCursor``: the creation time and id of the last
preview the page read), and nothing else: whoever sends it back gets what *they* may see after that place
(their tenant and the approver rule come from the caller, never from the token), so a token cannot widen
what anyone sees. ``read_token`` refuses whatever is not of the form ``page_token`` makes (a time since the
epoch, an id of printable ASCII as preview ids are), with ``InvalidRequestError`` (gRPC ``INVALID_ARGUMENT``)
and a constant message; a well-formed token of a place no listing read only starts the page there.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field

from sidecar.contract import Preview
from sidecar.errors import InvalidRequestError
from sidecar.state import PreviewCursor

__all__ = ["BAD_PAGE_TOKEN", "PreviewPage", "page_token", "read_token"]

BAD_PAGE_TOKEN = "page_token is not a token ListPreviews returned; list again without one to start from the newest"
_VERSION = "p1."  # a later format gets another prefix
_MAX_TOKEN_CHARS = 400
_ID = re.compile(r"[\x21-\x7e]{1,128}")  # a preview id: printable ASCII (``secrets.token_hex``), never a surrogate


@dataclass(frozen=True, slots=True)
class PreviewPage:
    """One page of previews, newest first, and the token of the next (older) page: empty on the last one. A
    page may hold fewer than asked and still have a next one (it read as many as one page may)."""

    previews: list[Preview] = field(default_factory=list)
    next_page_token: str = ""
    cursors: list[PreviewCursor] = field(default_factory=list, repr=False)  # where each preview was read

    def head(self, count: int) -> PreviewPage:
        """The first ``count`` (at least 1) previews of this page, and the token of the page after them: the
        page a listing of ``count`` would have given."""
        if len(self.previews) <= count:
            return self
        return PreviewPage(self.previews[:count], page_token(self.cursors[count - 1]), self.cursors[:count])


def page_token(cursor: PreviewCursor) -> str:
    """The token of the page after ``cursor``."""
    text = json.dumps([cursor.created_at, cursor.preview_id], separators=(",", ":"))
    return _VERSION + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def read_token(token: str) -> PreviewCursor | None:
    """The place ``token`` holds (``None`` for the empty token: the newest); ``InvalidRequestError`` for a
    token not of the form ``page_token`` makes."""
    if not token:
        return None
    if len(token) > _MAX_TOKEN_CHARS or not token.startswith(_VERSION):
        raise InvalidRequestError(BAD_PAGE_TOKEN)
    body = token.removeprefix(_VERSION)
    try:
        place = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        raise InvalidRequestError(BAD_PAGE_TOKEN) from None
    match place:
        case [float() | int() as created_at, str() as preview_id] if (
                not isinstance(created_at, bool) and math.isfinite(created_at) and created_at >= 0
                and _ID.fullmatch(preview_id)):
            return PreviewCursor(float(created_at), preview_id)
    raise InvalidRequestError(BAD_PAGE_TOKEN)
