"""Batched audit writes: queued events written in order, many per transaction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sidecar.errors import StoreUnavailableError
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent
from sidecar.state.rows import audit_row

__all__ = ["AUDIT_LINGER_SECONDS", "AuditBatcher"]

AUDIT_LINGER_SECONDS = 0.005
log = logging.getLogger("toolbooth.store")


class AuditBatcher:
    """Queued audit rows, written in order by a single drain task, one ``write`` per batch.

    The drain lingers ``AUDIT_LINGER_SECONDS`` first, so that under load many calls share
    one commit. A failed batch is logged, not raised: the calls it records are over.
    """

    def __init__(self, write: Callable[[list[Row]], Awaitable[None]]) -> None:
        self._write = write
        self._pending: list[Row] = []
        self._drainer: asyncio.Task[None] | None = None

    def put(self, event: AuditEvent) -> None:
        """Queue ``event``; start the drain task unless it runs."""
        self._pending.append(audit_row(event))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def flush(self) -> None:
        """Wait until every queued row is written (or its failure logged)."""
        if self._drainer is not None:
            await asyncio.shield(self._drainer)

    async def _drain(self) -> None:
        await asyncio.sleep(AUDIT_LINGER_SECONDS)  # let concurrent calls join the batch
        while self._pending:
            rows, self._pending = self._pending, []
            try:
                await self._write(rows)
            except StoreUnavailableError as exc:
                log.error("%d audit event(s) could not be written: %s", len(rows), exc)
