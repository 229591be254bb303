"""Batched audit writes: queued events written in order, many per transaction.

``write`` makes a batch lasting (``Lasting.write``: in the store, else kept in the local journal);
it raises only when the data is refused (``StoreRefusedError``, or anything the chain refuses) or
when neither the store nor the journal takes it. One bad row must not cost the other calls their
events: when a batch is refused, its rows are written again one at a time, in order, so every row
that can be written is; a row refused alone, or a batch nothing can take, is logged (by request id
and status, never its values) and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sidecar.errors import StoreRefusedError, StoreUnavailableError
from sidecar.state.chain import EVENT_COLUMNS
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent
from sidecar.state.rows import audit_row

__all__ = ["BATCH_ROWS", "AuditBatcher"]

log = logging.getLogger("toolbooth.store")

BATCH_ROWS = 256  # a batch this long is written without waiting out the linger


class AuditBatcher:
    """Queued audit rows, written in order by a single drain task, one ``write`` per batch.

    The drain starts with the first event queued and lets the batch gather for ``linger`` seconds (or until
    it holds ``BATCH_ROWS``) before writing it; the events queued while it writes form the next batch. So
    under load many calls share one commit (which the store's group commit shares with other writes): each
    commit costs the store's thread a trip and the disk a sync, whatever it holds. ``flush`` writes at once.
    A refused batch is retried row by row; a refused row is logged, not raised: the calls it records are over.
    """

    def __init__(self, write: Callable[[list[Row]], Awaitable[None]], *, linger: float = 0.0) -> None:
        self._write = write
        self.linger = linger
        self._pending: list[Row] = []
        self._writing = 0  # rows of the batch being written
        self._drainer: asyncio.Task[None] | None = None
        self._gathering: asyncio.Future[None] | None = None  # resolved when the batch stops gathering
        self._flushing = 0  # callers of ``flush`` waiting: no batch gathers meanwhile

    def put(self, event: AuditEvent) -> None:
        """Queue ``event``; start the drain task unless it runs."""
        self._pending.append(audit_row(event))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        elif len(self._pending) >= BATCH_ROWS:
            self._stop_gathering()

    @property
    def depth(self) -> int:
        """Rows queued or being written, not yet in the store (or the journal)."""
        return len(self._pending) + self._writing

    async def flush(self) -> None:
        """Write every queued row now; return once they are written (or their failure logged)."""
        if self._drainer is not None:
            self._flushing += 1
            self._stop_gathering()
            try:
                await asyncio.shield(self._drainer)
            finally:
                self._flushing -= 1

    async def _drain(self) -> None:
        while self._pending:
            if self.linger > 0 and not self._flushing and len(self._pending) < BATCH_ROWS:
                await self._gather()
            rows, self._pending = self._pending, []
            self._writing = len(rows)
            try:
                await self._write_batch(rows)
            finally:
                self._writing = 0

    async def _gather(self) -> None:
        """Wait ``linger`` seconds, or less if the batch fills or is flushed."""
        loop = asyncio.get_running_loop()
        gathering = self._gathering = loop.create_future()
        timer = loop.call_later(self.linger, self._stop_gathering)
        try:
            await gathering
        finally:
            timer.cancel()
            self._gathering = None

    def _stop_gathering(self) -> None:
        if self._gathering is not None and not self._gathering.done():
            self._gathering.set_result(None)

    async def _write_batch(self, rows: list[Row]) -> None:
        failure = await self._failure(rows)
        if failure is None:
            return
        if len(rows) == 1 or _unwritable(failure):
            _dropped(rows, failure)
            return
        log.warning("a batch of %d audit events could not be written (%s); writing them one by one",
                    len(rows), failure)
        for row in rows:  # in order: the chain links them as they are written
            if (alone := await self._failure([row])) is not None:
                _dropped([row], alone)

    async def _failure(self, rows: list[Row]) -> Exception | None:
        """Write ``rows`` in one transaction; the failure, if any, returned (never raised)."""
        try:
            await self._write(rows)
        except Exception as exc:  # noqa: BLE001 - any failure: a store error, or a row the store or chain refuses
            return exc
        return None


def _unwritable(failure: Exception) -> bool:
    """Whether ``failure`` says nothing could take the batch (neither the store nor the local journal),
    rather than that some row in it is refused."""
    return isinstance(failure, StoreUnavailableError) and not isinstance(failure, StoreRefusedError)


def _dropped(rows: list[Row], failure: Exception) -> None:
    events = [dict(zip(EVENT_COLUMNS, row, strict=False)) for row in rows]
    log.error("%d audit event(s) could not be written, dropped (%s): %s", len(rows),
              ", ".join(f"request {event['request_id']} status {event['status']}" for event in events), failure)
