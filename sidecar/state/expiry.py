"""Expiry of finished idempotency records: kept ``store.idempotency_retention_hours``, then deleted."""

from __future__ import annotations

import asyncio
import logging
import time

from sidecar.errors import StoreUnavailableError
from sidecar.state.store import Store

__all__ = ["EXPIRY_INTERVAL_SECONDS", "Expiry"]

EXPIRY_INTERVAL_SECONDS = 60.0
log = logging.getLogger("toolbooth.store")


class Expiry:
    """Deletes records completed more than ``retention_seconds`` ago, in the background, at most once
    per ``EXPIRY_INTERVAL_SECONDS``; a failure is logged and tried again at the next interval."""

    def __init__(self, store: Store, retention_seconds: float) -> None:
        self._store, self._retention = store, retention_seconds
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
            count = await self._store.expire_operations(time.time() - self._retention)
        except StoreUnavailableError as exc:
            log.error("expired idempotency records could not be deleted: %s", exc)
            return
        if count:
            log.info("deleted %d idempotency record(s) completed over %g hours ago", count, self._retention / 3600)
