"""Expiry of what the store keeps for a while: finished idempotency records, kept
``store.idempotency_retention_hours``, and history events (``sidecar.state.history``), then deleted."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sidecar.errors import StoreUnavailableError

__all__ = ["EXPIRY_INTERVAL_SECONDS", "Expiry"]

EXPIRY_INTERVAL_SECONDS = 60.0
log = logging.getLogger("toolbooth.store")


class Expiry:
    """Deletes what is older than ``retention_seconds`` with ``delete`` (given the epoch seconds before which to
    delete, it says how many it deleted), in the background, at most once per ``EXPIRY_INTERVAL_SECONDS``; a
    failure is logged and tried again at the next interval. ``what`` (singular) and ``aged`` name them in the
    log: ``deleted 3 idempotency record(s) completed over 24 hours ago``. ``clock`` (epoch seconds) says when now
    is (tests move it on)."""

    def __init__(self, delete: Callable[[float], Awaitable[int]], retention_seconds: float, *, what: str,
                 aged: str, clock: Callable[[], float] = time.time) -> None:
        self._delete, self._retention, self._what, self._aged = delete, retention_seconds, what, aged
        self._clock = clock
        self._next = 0.0  # ``time.monotonic()`` of the next allowed run
        self._running: set[asyncio.Task[None]] = set()

    def poke(self) -> None:
        """Start a cleanup unless one ran within the interval."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + EXPIRY_INTERVAL_SECONDS
        task = asyncio.get_running_loop().create_task(self._expire())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def aclose(self) -> None:
        """Wait for a running cleanup."""
        await asyncio.gather(*self._running, return_exceptions=True)

    async def _expire(self) -> None:
        try:
            count = await self._delete(self._clock() - self._retention)
        except StoreUnavailableError as exc:
            log.error("expired %ss could not be deleted: %s", self._what, exc)
            return
        if count:
            log.info("deleted %d %s(s) %s over %g hours ago", count, self._what, self._aged, self._retention / 3600)
