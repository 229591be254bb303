"""What every store shares: the audit row layout and queries, claim outcomes and batched audit writes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sidecar.errors import StoreUnavailableError
from sidecar.state import AuditEvent, AuditRecord, Claim, ClaimState
from sidecar.state.chain import EVENT_COLUMNS

AUDIT_COLUMNS = EVENT_COLUMNS
CHAINED_COLUMNS = (*AUDIT_COLUMNS, "prev_hash", "hash")
AUDIT_LINGER_SECONDS = 0.005
LAST_AUDIT_HASH = "SELECT hash FROM audit ORDER BY id DESC LIMIT 1"
# A keyed call ends (completed or released) by its deadline; one still in progress this long after it
# belonged to a sidecar that died: its outcome is unknown.
DEADLINE_GRACE_SECONDS = 5.0

Row = tuple[object, ...]
log = logging.getLogger("toolbooth.store")


def audit_row(event: AuditEvent) -> Row:
    """``event`` as a row of ``AUDIT_COLUMNS``."""
    return tuple(getattr(event, column) for column in AUDIT_COLUMNS)


def insert_audit_sql(placeholder: str) -> str:
    """The INSERT of one chained audit row, with the driver's ``placeholder``."""
    return (f"INSERT INTO audit ({', '.join(CHAINED_COLUMNS)}) "
            f"VALUES ({', '.join([placeholder] * len(CHAINED_COLUMNS))})")


def select_audit_sql(placeholder: str, *, newest_first: bool) -> str:
    """The SELECT of audit records after an id (first parameter), at most a limit (second)."""
    order = "DESC" if newest_first else "ASC"
    return (f"SELECT id, {', '.join(CHAINED_COLUMNS)} FROM audit WHERE id > {placeholder} "
            f"ORDER BY id {order} LIMIT {placeholder}")


def audit_record(row: Row) -> AuditRecord:
    """A row of ``select_audit_sql`` as a record."""
    ident, *values = row
    count = len(AUDIT_COLUMNS)
    return AuditRecord(int(ident), AuditEvent(*values[:count]), *values[count:])  # type: ignore[arg-type]


def existing_claim(stored_hash: str, result_json: str | None, deadline_at: float | None,
                   request_hash: str) -> Claim:
    """What a key already held by ``stored_hash`` means for a call hashing to ``request_hash``."""
    if stored_hash != request_hash:
        return Claim(ClaimState.REUSED)
    if result_json is None:
        return Claim(ClaimState.UNKNOWN if is_abandoned(deadline_at) else ClaimState.IN_PROGRESS)
    return Claim(ClaimState.REPLAY, result_json)


def is_abandoned(deadline_at: float | None) -> bool:
    """Whether a record in progress is past ``deadline_at`` by more than the grace: its owner died."""
    return deadline_at is not None and deadline_at + DEADLINE_GRACE_SECONDS < time.time()


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


class AuditMethods:
    """The audit half of the ``Store`` protocol, the same on every backend. A store supplies
    ``_write_audit`` (append rows, linked into the chain) and ``audit_records``."""

    _audit: AuditBatcher

    async def _write_audit(self, rows: list[Row]) -> None:
        raise NotImplementedError

    async def audit_records(self, *, after_id: int = 0, limit: int | None = None,
                            newest_first: bool = False) -> list[AuditRecord]:
        raise NotImplementedError

    async def record_audit(self, event: AuditEvent) -> None:
        await self._write_audit([audit_row(event)])

    def queue_audit(self, event: AuditEvent) -> None:
        self._audit.put(event)

    async def flush_audit(self) -> None:
        await self._audit.flush()

    async def audit_events(self) -> list[AuditEvent]:
        """Every audit event (queued ones included), oldest first."""
        await self.flush_audit()
        return [record.event for record in await self.audit_records()]
