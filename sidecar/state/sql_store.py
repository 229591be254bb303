"""``SqlStore``: the one ``Store`` implementation, over any ``Driver``.

A claim is ``INSERT ... ON CONFLICT DO NOTHING``: the primary key decides which of any number of
concurrent claimers, in any process sharing the database, owns a key; the others then read the row
that won. Completions, releases, resolutions and overrun marks touch only a record still without a
result, so an operator's resolution is never overwritten or deleted. Each preview move is one
conditional ``UPDATE``: of any number of concurrent callers, one wins.

The writes of concurrent calls are group-committed (``sidecar.state.group``): audit appends (a write's
dispatching event, batches of queued events), completions and releases, and on a single-writer
database (SQLite) claims too, each queued and written with whatever else is queued, one transaction
per batch, each caller answered once the transaction holding its write committed. Each store instance
appends to an audit chain of its own (``sidecar.state.chain``), registered at its first append, linked
after the newest event of the log then; a batch reads its chain's last hash and links its rows to it
(``chain.chained``): no lock is shared by the stores of a database. On SQLite, which takes one writer at
a time, every store appends to chain 1. On PostgreSQL a claim is an autocommit
``INSERT`` and the read of the row that won may find it released, and the claim starts over, at most
``CLAIM_ATTEMPTS`` times. Outcomes (completions, releases) and audit batches are lasting writes
(``Lasting``): retried within bounds, else kept in the local journal and applied when the store is back;
kept outcomes are applied before any key is claimed or read again.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from dataclasses import astuple

from sidecar.contract import PreviewState
from sidecar.errors import StoreUnavailableError
from sidecar.metrics import Metrics
from sidecar.state.audit import AuditBatcher
from sidecar.state.driver import Driver, Row
from sidecar.state.group import GroupCommit
from sidecar.state.history import HistoryLog
from sidecar.state.journal import AuditRows, Completion, Journal, Release, Write
from sidecar.state.lasting import Lasting, retried
from sidecar.state.metered import CountingDriver
from sidecar.state.records import (
    AuditEvent,
    AuditRecord,
    ChainStart,
    Claim,
    KeyScope,
    OperationRecord,
    PreviewCursor,
    PreviewQuery,
    PreviewRecord,
)
from sidecar.state.rows import audit_record, audit_row, operation_record, preview_record, preview_row
from sidecar.state.statements import StoreStatements
from sidecar.state.units import AuditWrite, ChainTail, ClaimWrite, StatementWrite, found

__all__ = ["CLAIM_ATTEMPTS", "SHARED_CHAIN", "SqlStore"]

SHARED_CHAIN = 1  # the chain of the events from before per-instance chains, and of every SQLite store
# The row an INSERT conflicted with can be released before the SELECT reads it; then the claim starts over.
# Each new start means another claim won meanwhile; a key churned this often fails as unavailable (retryable).
CLAIM_ATTEMPTS = 10
# The audited trail (``json.dumps(call.trail)``) of a call sent with an approval: a pattern that finds every
# one (and perhaps more: its reader checks the trail's ``approval_id`` itself).
_APPROVAL_TRAIL = '%"approval_id": %'


class SqlStore:
    """The ``Store`` over ``driver``, whose schema its migrations brought to the latest version."""

    def __init__(self, driver: Driver) -> None:
        self.driver: Driver = driver
        self._sql = StoreStatements.of(driver.dialect)
        self._lasting = Lasting(self._apply)
        self._audit = AuditBatcher(lambda rows: self._lasting.write(AuditRows(tuple(rows))))
        self._chain_key: bytes | None = None
        self.group = GroupCommit(lambda: self.driver.transaction(lock=None))
        self._tail = ChainTail(SHARED_CHAIN, None, shared=True) if driver.dialect.single_writer else None
        self._starting = asyncio.Lock()
        self.history = HistoryLog(lambda: self.driver)

    @property
    def kept_writes(self) -> int:
        """How many writes the local journal holds that the store has not taken yet."""
        journal = self._lasting.journal
        return 0 if journal is None else journal.size

    def observe(self, metrics: Metrics) -> None:
        """Count the statements that fail (``toolbooth_store_errors_total``) and show how many audit events wait
        to be written (``toolbooth_audit_queue_depth``, read at each scrape) in ``metrics``."""
        self.driver = CountingDriver(self.driver, self._sql, metrics.store_error)
        metrics.audit_queue = lambda: self._audit.depth

    async def keep_in(self, journal: Journal) -> None:
        """From now on keep the writes the store cannot take in ``journal`` (without one, such a write fails);
        first apply what an earlier run kept there (what the store cannot take yet, in the background)."""
        self._lasting.journal = journal
        try:
            await self._lasting.catch_up(audit=True)
        except StoreUnavailableError:
            self._lasting.replay_soon()

    # --- idempotency and operations ---------------------------------------------------------

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str, *,
                    deadline_at: float | None = None, legacy_hash: str | None = None) -> Claim:
        """Atomically claim ``scope`` for ``request_hash`` or report the record that holds it (held for
        ``request_hash`` or ``legacy_hash``: the same request)."""
        await self._lasting.catch_up()
        key = astuple(scope)
        params = (*key, request_hash, request_id, deadline_at)
        if self.driver.dialect.single_writer:
            return await self.group.run(ClaimWrite(self._sql, key, params, request_hash, legacy_hash))
        async with self.driver.session() as session:
            for _ in range(CLAIM_ATTEMPTS):
                if await session.execute(self._sql.claim, params) == 1:
                    return Claim()
                if rows := await session.fetch(self._sql.holder, key):
                    return found(rows, request_hash, legacy_hash)
        raise StoreUnavailableError(f"idempotency key {scope.key!r} was released {CLAIM_ATTEMPTS} times "
                                    "while being claimed")

    async def complete(self, scope: KeyScope, result_json: str, *, request_id: str) -> None:
        """Store the final result of the key ``request_id`` claimed (never over a result already stored)."""
        await self._lasting.write(Completion(scope, request_id, result_json))

    async def release(self, scope: KeyScope, *, request_id: str) -> None:
        """Forget the key ``request_id`` claimed, whose call certainly had no effect (never one with a result)."""
        await self._lasting.write(Release(scope, request_id))

    async def mark_overran(self, scope: KeyScope, *, now: float) -> None:
        """Mark a claimed key's record unknown: its handler outlived the deadline (never one with a result)."""
        await self.driver.execute(self._sql.overran, (now, *astuple(scope)))

    async def operation(self, scope: KeyScope) -> OperationRecord | None:
        """The record holding ``scope``, if any."""
        await self._lasting.catch_up()
        rows = await self.driver.fetch(self._sql.by_key, astuple(scope))
        return operation_record(rows[0]) if rows else None

    async def operation_of_request(self, tenant: str, principal_id: str, request_id: str) -> OperationRecord | None:
        """The record the call ``request_id`` of this principal claimed, if any."""
        await self._lasting.catch_up()
        rows = await self.driver.fetch(self._sql.by_request, (tenant, principal_id, request_id))
        return operation_record(rows[0]) if rows else None

    async def pending_operations(self, *, limit: int = 1000) -> list[OperationRecord]:
        """Records without a result (in progress or unknown), oldest first."""
        await self._lasting.catch_up()
        return [operation_record(row) for row in await self.driver.fetch(self._sql.pending, (limit,))]

    async def resolve_operation(self, scope: KeyScope, result_json: str, *, now: float) -> bool:
        """Store ``result_json`` for a record still without a result; ``False`` if there is none such."""
        await self._lasting.catch_up()
        return await self.driver.execute(self._sql.resolve, (result_json, now, *astuple(scope))) == 1

    async def expire_operations(self, completed_before: float) -> int:
        """Delete the records completed before ``completed_before`` (never one without a result); how many."""
        return await self.driver.execute(self._sql.expire, (completed_before,))

    # --- previews ---------------------------------------------------------------------------

    async def save_preview(self, preview: PreviewRecord, *, max_pending: int) -> bool:
        """Store a new (pending) preview, durable on return; ``False`` (nothing stored) if its principal already
        holds ``max_pending`` unexpired pending ones, counted under a lock of that principal's."""
        async with self.driver.transaction(lock=_principal_lock(preview.tenant, preview.principal_id)) as tx:
            params = (preview.tenant, preview.principal_id, preview.created_at)
            [(held,)] = await tx.fetch(self._sql.pending_of_principal, params)
            if held >= max_pending:
                return False
            await tx.execute(self._sql.insert_preview, preview_row(preview))
        return True

    async def get_preview(self, preview_id: str) -> PreviewRecord | None:
        """The preview with this id, if any."""
        rows = await self.driver.fetch(self._sql.get_preview, (preview_id,))
        return preview_record(rows[0]) if rows else None

    async def previews(self, query: PreviewQuery) -> list[PreviewRecord]:
        """The previews ``query`` selects, newest first."""
        after = query.after or PreviewCursor(math.inf, "")
        params = (query.state.value, query.tool, query.principal_id, query.expires_after, query.expires_by,
                  query.created_after, after.created_at, after.preview_id, query.limit)
        if query.tenant is None:
            rows = await self.driver.fetch(self._sql.list_previews, params)
        else:
            rows = await self.driver.fetch(self._sql.list_tenant_previews, (query.tenant, *params))
        return [preview_record(row) for row in rows]

    async def decide_preview(self, preview_id: str, state: PreviewState, *, decided_by: str, comment: str | None,
                             now: float) -> bool:
        """Atomically move a pending preview to ``state``; ``False`` if it was not pending."""
        params = (state.value, decided_by, comment, now, preview_id)
        return await self.driver.execute(self._sql.decide_preview, params) == 1

    async def consume_approval(self, preview_id: str, *, now: float, key: str | None = None) -> bool:
        """Atomically mark an approved preview used; ``False`` if it was not approved (or already used)."""
        return await self.driver.execute(self._sql.consume_approval, (now, key, preview_id)) == 1

    async def restore_approval(self, preview_id: str) -> bool:
        """Move a used preview back to approved; ``False`` if it was not used."""
        return await self.driver.execute(self._sql.restore_approval, (preview_id,)) == 1

    # --- audit ------------------------------------------------------------------------------

    async def record_audit(self, event: AuditEvent) -> None:
        """Append ``event`` to the audit log, trying again within bounds; durable in the store on return."""
        row = audit_row(event)
        await retried(lambda: self._append_audit((row,)))

    def queue_audit(self, event: AuditEvent) -> None:
        """Like ``record_audit``, but written soon in a batch (in order), or kept in the local journal."""
        self._audit.put(event)

    async def flush_audit(self) -> None:
        """Wait until every queued audit event is written."""
        await self._audit.flush()

    async def audit_records(self, *, after_id: int = 0, limit: int | None = None,
                            newest_first: bool = False) -> list[AuditRecord]:
        """Stored events with an id above ``after_id``, oldest first (or newest first), at most ``limit``."""
        if limit is None:
            sql = self._sql.audit_all_after_newest if newest_first else self._sql.audit_all_after
            rows = await self.driver.fetch(sql, (after_id,))
        else:
            sql = self._sql.audit_after_newest if newest_first else self._sql.audit_after
            rows = await self.driver.fetch(sql, (after_id, limit))
        return [audit_record(row) for row in rows]

    async def approval_audit(self, since: str, *, limit: int) -> list[AuditRecord]:
        """Stored events of calls that carried an approval, written at or after ``since``, newest first."""
        rows = await self.driver.fetch(self._sql.audit_of_approvals, (0, since, _APPROVAL_TRAIL, limit))
        return [audit_record(row) for row in rows]

    async def audit_events(self) -> list[AuditEvent]:
        """Every audit event (queued ones included), oldest first."""
        await self.flush_audit()
        return [record.event for record in await self.audit_records()]

    async def audit_mask_key(self, candidate: bytes) -> bytes:
        """The store's key for masking audited values; ``candidate`` becomes it if it has none yet."""
        await self.driver.execute(self._sql.set_mask_key, (candidate.hex(),))
        [(key,)] = await self.driver.fetch(self._sql.mask_key)
        return bytes.fromhex(key)

    def linger_audit(self, seconds: float) -> None:
        """Let queued audit events gather ``seconds`` before a commit writes them together (0: write at once)."""
        self._audit.linger = seconds

    def use_chain_key(self, key: bytes | None) -> None:
        """Key the links appended from now on with ``key`` (``None``: unkeyed); the key is never stored."""
        self._chain_key = key

    async def audit_chain_records(self, chain: int, *, after_id: int, limit: int) -> list[AuditRecord]:
        """Stored events of ``chain`` with an id above ``after_id``, oldest first, at most ``limit``."""
        return [audit_record(row) for row in await self.driver.fetch(self._sql.chain_after, (after_id, chain, limit))]

    async def audit_chains(self) -> list[ChainStart]:
        """Every registered audit chain, by id."""
        return [ChainStart(int(chain), None if link_id is None else int(link_id), link_hash)
                for chain, link_id, link_hash in await self.driver.fetch(self._sql.chains)]

    async def aclose(self) -> None:
        """Write queued audit events and kept writes (what the store cannot take stays kept for the next
        start), then release the driver's connections and threads."""
        await self.flush_audit()
        await self._lasting.aclose()
        await self.driver.aclose()

    async def _apply(self, write: Write) -> None:
        match write:
            case Completion(scope, request_id, result_json):
                await self.group.run(StatementWrite(self._sql.complete, (result_json, *astuple(scope), request_id)))
            case Release(scope, request_id):
                await self.group.run(StatementWrite(self._sql.release, (*astuple(scope), request_id)))
            case AuditRows(rows):
                await self._append_audit(rows)

    async def _append_audit(self, rows: tuple[Row, ...]) -> None:
        await self.group.run(AuditWrite(self._sql, rows, self._chain_key, await self._chain_tail()))

    async def _chain_tail(self) -> ChainTail:
        """This store's chain, registered now if it has none yet."""
        async with self._starting:
            if self._tail is None:
                [(chain, link_hash)] = await self.driver.fetch(self._sql.start_chain)
                self._tail = ChainTail(int(chain), link_hash, shared=False)
            return self._tail


def _principal_lock(tenant: str, principal_id: str) -> int:
    """The named lock (a signed 64-bit key) under which one principal's pending previews are counted and added."""
    digest = hashlib.sha256(f"toolbooth preview holder\0{tenant}\0{principal_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
