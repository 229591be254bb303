"""A streamed call: the handler's progress reports go to the caller at a bounded rate, then its result.

``stream_call`` runs the call (``Pipeline.execute``, with a ``ProgressFeed`` as the call's progress
sink) and meanwhile hands the reports to ``send``: the first at once, then at most ``per_second``;
reports that arrive in between are coalesced into the latest one, which is sent when its turn comes
and, at the latest, right before the result. So a handler that reports 10,000 times costs the caller a
handful of events, and the caller always sees the last report. ``send`` may be slow (a caller that
reads slowly): the call runs on, the feed keeps only the latest report.

Cancelling ``stream_call`` (the caller went away) cancels the call as a unary call is cancelled: a read's
handler gets ``CancelledError``; a write that has claimed its key is detached and finishes, recorded.
Reports made after the result (a sync handler's thread that outlived its deadline) are dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

from sidecar.contract import Progress, ToolResult
from sidecar.tools.definition import ProgressSink

__all__ = ["ProgressFeed", "Send", "stream_call"]

Send = Callable[[Progress], Awaitable[None]]


class ProgressFeed:
    """One streamed call's progress sink: keeps the latest report and wakes the sender; thread-safe."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._latest: Progress | None = None
        self._waking = False  # a wake-up of the sender is due: at most one at a time
        self._closed = False
        self.ready = asyncio.Event()  # set when a report waits

    def report(self, update: Progress) -> None:
        """Keep ``update`` as the latest report (replacing one not sent yet) and wake the sender."""
        with self._lock:
            if self._closed:
                return
            self._latest = update
            if self._waking:
                return
            self._waking = True
        if threading.get_ident() == self._loop_thread:
            self.ready.set()
        else:
            try:
                self._loop.call_soon_threadsafe(self.ready.set)
            except RuntimeError:  # the loop is closed: nobody listens any more
                pass

    def take(self) -> Progress | None:
        """The latest report not sent yet, if any."""
        with self._lock:
            latest, self._latest, self._waking = self._latest, None, False
            self.ready.clear()
        return latest

    def close(self) -> Progress | None:
        """Stop taking reports; the latest one not sent yet, if any."""
        with self._lock:
            self._closed = True
        return self.take()


async def stream_call(execute: Callable[[ProgressSink], Awaitable[ToolResult]], send: Send, *,
                      per_second: float) -> ToolResult:
    """Run ``execute(feed)`` and send its progress reports (at most ``per_second``, the last always) while it
    runs; return its result once the last report has been sent."""
    feed = ProgressFeed()
    call = asyncio.ensure_future(execute(feed))
    interval, next_at = 1.0 / per_second, 0.0
    try:
        while not call.done():
            waiting = asyncio.ensure_future(feed.ready.wait())
            try:
                await asyncio.wait((call, waiting), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
            if (delay := next_at - time.monotonic()) > 0:
                await asyncio.wait((call,), timeout=delay)  # coalesce until this report's turn
            if call.done():
                break
            if (update := feed.take()) is not None:
                await send(update)
                next_at = time.monotonic() + interval
        if (last := feed.close()) is not None:
            await send(last)
        return call.result()
    finally:
        if not call.done():
            call.cancel()
            await asyncio.wait((call,))
