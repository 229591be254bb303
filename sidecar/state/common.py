"""What every store shares: the audit row layout, claim outcomes and batched audit writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import fields

from sidecar.state import AuditEvent, Claim, ClaimState, StoreUnavailableError

AUDIT_COLUMNS = tuple(f.name for f in fields(AuditEvent))
AUDIT_LINGER_SECONDS = 0.005

Row = tuple[object, ...]
log = logging.getLogger("toolbooth.store")


def audit_row(event: AuditEvent) -> Row:
    """``event`` as a row of ``AUDIT_COLUMNS``."""
    return tuple(getattr(event, column) for column in AUDIT_COLUMNS)


def existing_claim(stored_hash: str, result_json: str | None, request_hash: str) -> Claim:
    """What a key already held by ``stored_hash`` means for a call hashing to ``request_hash``."""
    if stored_hash != request_hash:
        return Claim(ClaimState.REUSED)
    if result_json is None:
        return Claim(ClaimState.IN_PROGRESS)
    return Claim(ClaimState.REPLAY, result_json)


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
