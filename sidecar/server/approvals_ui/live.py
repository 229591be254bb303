"""Live updates of an open inbox page: server-sent events telling the page that what it shows changed.

``GET /inbox/events?since=VERSION`` (the session cookie required) streams ``text/event-stream``. Every
``approvals_ui.live_seconds`` the stream reads the pending previews the session's principal may decide,
exactly as the inbox (and ``ListPreviews``) does, and sends ``event: changed`` with their new ``version``
when that set differs from the one the page was rendered with (``since``) or last told of: a preview
arrived, expired, or was decided elsewhere. An event carries the version only, a hash of what this
person may see, never a preview; the page's script then fetches the page again and swaps its list in
(``static/live.js``). A stream ends when its session does (``event: signed-out``), when a newer stream of
the same principal takes its place (``event: superseded``: the page then reloads on a timer), when the inbox
closes (``close``, awaited before the listener stops, so no stream holds the shutdown up), or when the browser
goes away; its connection is closed with it. How many streams are open is bounded per principal and in all
(``stream_slots``); a stream past the bound of all is refused with 503 and ``Retry-After``. A failing store
skips a round (logged): the stream stays and tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Iterable

from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sidecar.contract import Preview
from sidecar.errors import DependencyError
from sidecar.pipeline.preview_pages import PreviewPage
from sidecar.server.approvals_ui.sessions import Session, Sessions
from sidecar.server.approvals_ui.stream_slots import Slot, StreamSlots
from sidecar.server.roles import MAX_LIST_LIMIT, ApprovalDesk

__all__ = ["HEARTBEAT_SECONDS", "RETRY_AFTER_SECONDS", "LiveUpdates", "version_of"]

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 30  # a refused stream's page reloads this often instead (its data-reload, live.js)
HEARTBEAT_SECONDS = 15.0  # a comment line this often keeps proxies from closing a quiet stream
_RETRY_MS = 5000  # how long the browser waits before it reconnects a dropped stream


def version_of(previews: Iterable[Preview]) -> str:
    """A short hash of a set of previews (their ids and hashes): equal for the same set, in any order."""
    digest = hashlib.sha256("\n".join(sorted(f"{p.preview_id}:{p.preview_hash}" for p in previews)).encode())
    return digest.hexdigest()[:20]


class LiveUpdates:
    """The event streams of one inbox's open pages."""

    def __init__(self, desk: ApprovalDesk, sessions: Sessions, slots: StreamSlots, *, interval: float) -> None:
        self._desk, self._sessions, self.slots, self._interval = desk, sessions, slots, interval
        self._closing, self._none_open = False, asyncio.Event()
        self._none_open.set()
        self._running: set[Slot] = set()  # every stream until its response has ended, superseded ones included

    @property
    def open_streams(self) -> int:
        return len(self._running)

    async def version(self, session: Session) -> tuple[PreviewPage, str]:
        """The newest pending previews ``session``'s principal may decide (one page of at most ``MAX_LIST_LIMIT``),
        and their version."""
        page = await self._desk.pending(session.principal, MAX_LIST_LIMIT)
        return page, version_of(page.previews)

    def response(self, session: Session, since: str) -> Response:
        """The event stream of a page of ``session`` rendered with the previews of version ``since``."""
        if self._closing:
            return PlainTextResponse("the inbox is stopping", status_code=503)
        slot = self.slots.take(session.principal)  # held now, so that pages opening at once cannot pass the caps
        if slot is None:
            return PlainTextResponse("The inbox holds as many live pages as it may; this page reloads on its own.",
                                     status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self._running.add(slot)
        self._none_open.clear()
        return _Stream(self, slot, session.id, since)

    async def close(self, timeout: float) -> None:
        """End every stream now and refuse new ones (the inbox is stopping); return once they have ended (at
        most ``timeout`` seconds: the listener's shutdown then closes what is left)."""
        self._closing = True
        for slot in self._running:
            slot.end()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_open.wait(), timeout)

    async def events(self, slot: Slot, session_id: str, since: str) -> AsyncIterator[bytes]:
        """The stream's lines: ``changed`` whenever the version differs from the last one sent (or ``since``)."""
        yield f"retry: {_RETRY_MS}\n\n".encode()
        last, quiet_since = since, time.monotonic()
        while not slot.over:
            session = self._sessions.get(session_id)
            if session is None:
                yield b"event: signed-out\ndata: \n\n"
                return
            current = await self._current(session, last)
            if current != last:
                yield f"event: changed\ndata: {current}\n\n".encode()
                last, quiet_since = current, time.monotonic()
            elif time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
                yield b": still here\n\n"
                quiet_since = time.monotonic()
            await slot.wait(self._interval)
        if slot.superseded:
            yield b"event: superseded\ndata: \n\n"

    def ended(self, slot: Slot) -> None:
        """The stream that ``response`` gave ``slot`` has ended."""
        self.slots.give_back(slot)
        self._running.discard(slot)
        if not self._running:
            self._none_open.set()

    async def _current(self, session: Session, last: str) -> str:
        """The version now; ``last`` again when it cannot be read (the store or the approver policy failing)."""
        try:
            return (await self.version(session))[1]
        except DependencyError as exc:
            log.warning("approval inbox: live update for %s skipped: %s", session.principal.id, exc)
            return last


class _Stream(StreamingResponse):
    """A session's event stream, holding its slot until it ends, however it ends; its connection closes with it."""

    def __init__(self, live: LiveUpdates, slot: Slot, session_id: str, since: str) -> None:
        super().__init__(live.events(slot, session_id, since), media_type="text/event-stream",
                         headers={"X-Accel-Buffering": "no", "Connection": "close"})
        self._live, self._slot = live, slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._live.ended(self._slot)
