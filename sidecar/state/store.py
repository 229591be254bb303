"""The ``Store`` protocol: what the pipeline and the CLI ask of durable state.

One implementation (``sidecar.state.sql_store.SqlStore``) serves every backend. Its guarantees:
a claim is atomic across every process sharing the database (of any number of concurrent claimers
one owns the key); an operator's resolution is never overwritten or deleted by a late outcome; a
preview moves pending -> approved | denied and approved -> used once each, whoever races (and used ->
approved only when the call that used it gives it back, having had no effect); the audit
log is a set of linear hash chains (``sidecar.state.chain``), one per store instance that appends; an
outcome or audit event the store cannot take is kept in a local journal (``sidecar.state.journal``) and
applied when it is back; the metered calls of one history scope are counted one reserver after the other,
in every process (``sidecar.state.history``).
"""

from __future__ import annotations

from typing import Protocol

from sidecar.contract import PreviewState
from sidecar.state.history import HistoryLog
from sidecar.state.records import (
    AuditEvent,
    AuditRecord,
    ChainStart,
    Claim,
    KeyScope,
    OperationRecord,
    PreviewQuery,
    PreviewRecord,
)

__all__ = ["Store"]


class Store(Protocol):
    """Idempotency records (operations), previews with their approvals, and audit events."""

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str, *,
                    deadline_at: float | None = None, legacy_hash: str | None = None) -> Claim:
        """Atomically claim ``scope`` for ``request_hash`` or report the record that holds it.

        ``deadline_at`` (epoch seconds) bounds the call claiming: a record still in progress
        ``DEADLINE_GRACE_SECONDS`` after it is ``UNKNOWN``; ``None`` never expires. A record held for
        ``request_hash`` or for ``legacy_hash`` (the same request, hashed as a sidecar before RFC 8785
        did) is the same request; any other is ``reused``.
        """
        ...

    async def complete(self, scope: KeyScope, result_json: str, *, request_id: str) -> None:
        """Store the final result of the key the call ``request_id`` claimed (never over a result already
        stored, never in another call's record). Durable on return: in the store, or kept in the local journal
        and applied before the key is claimed or read again."""
        ...

    async def release(self, scope: KeyScope, *, request_id: str) -> None:
        """Forget the key the call ``request_id`` claimed, which certainly had no effect (never a record with a
        result, never another call's). Durable on return, as ``complete``."""
        ...

    async def mark_overran(self, scope: KeyScope, *, now: float) -> None:
        """Mark a claimed key's record ``UNKNOWN`` from ``now`` on: its handler outlived the deadline and may
        have had its effect (never one with a result). Its handler's late result or an operator's settles it."""
        ...

    async def operation(self, scope: KeyScope) -> OperationRecord | None:
        """The record holding ``scope``, if any."""
        ...

    async def operation_of_request(self, tenant: str, principal_id: str, request_id: str) -> OperationRecord | None:
        """The record the call ``request_id`` of this principal claimed, if any."""
        ...

    async def pending_operations(self, *, limit: int = 1000) -> list[OperationRecord]:
        """Records without a result (in progress or unknown), oldest first."""
        ...

    async def resolve_operation(self, scope: KeyScope, result_json: str, *, now: float) -> bool:
        """Store ``result_json`` for a record still without a result; ``False`` if there is none such."""
        ...

    async def expire_operations(self, completed_before: float) -> int:
        """Delete the records completed before ``completed_before`` (never one without a result); how many."""
        ...

    async def save_preview(self, preview: PreviewRecord, *, max_pending: int) -> bool:
        """Store a new (pending) preview, durable on return, unless its principal (tenant and id) already holds
        ``max_pending`` unexpired pending previews (``False``: nothing stored); concurrent saves of one principal,
        in any process sharing the database, are counted one after the other."""
        ...

    async def get_preview(self, preview_id: str) -> PreviewRecord | None:
        """The preview with this id, if any."""
        ...

    async def previews(self, query: PreviewQuery) -> list[PreviewRecord]:
        """The previews ``query`` selects (tenant, state, tool, requester, expiry, after a cursor), newest first:
        filtered in the store, so that one tenant's previews never push another's out of a page."""
        ...

    async def decide_preview(self, preview_id: str, state: PreviewState, *, decided_by: str, comment: str | None,
                             now: float) -> bool:
        """Atomically move a pending preview to ``state`` (approved or denied); ``False`` if it was not pending."""
        ...

    async def consume_approval(self, preview_id: str, *, now: float, key: str | None = None) -> bool:
        """Atomically mark an approved preview used (by the call with idempotency ``key``); ``False`` if it
        was not approved (or already used)."""
        ...

    async def restore_approval(self, preview_id: str) -> bool:
        """Atomically move a used preview back to approved, for the call that used it and certainly had no
        effect (it never ran, or its tool said nothing happened); ``False`` if it was not used."""
        ...

    async def record_audit(self, event: AuditEvent) -> None:
        """Append ``event`` to the audit log, trying again within bounds; durable in the store on return (never
        kept in the local journal: a write's dispatch is in the store before its handler runs)."""
        ...

    def queue_audit(self, event: AuditEvent) -> None:
        """Like ``record_audit``, but written soon in a batch (in order), or kept in the local journal when the
        store cannot take it; only what neither takes, or the store refuses as data, is logged and dropped."""
        ...

    async def flush_audit(self) -> None:
        """Wait until every queued audit event is written."""
        ...

    async def audit_records(self, *, after_id: int = 0, limit: int | None = None,
                            newest_first: bool = False) -> list[AuditRecord]:
        """Stored events with an id above ``after_id``, oldest first (or newest first), at most ``limit``."""
        ...

    async def approval_audit(self, since: str, *, limit: int) -> list[AuditRecord]:
        """Stored events of calls that carried an approval (their trail's ``approval_id``), written at or after
        the audit time ``since``, newest first, at most ``limit``."""
        ...

    async def audit_mask_key(self, candidate: bytes) -> bytes:
        """The store's key for masking audited values; ``candidate`` becomes it if it has none yet."""
        ...

    def use_chain_key(self, key: bytes | None) -> None:
        """Key the links appended from now on with ``key`` (HMAC; ``None``: unkeyed SHA-256). Set once,
        before any append, by whoever opened the store; the key is never stored."""
        ...

    async def audit_chain_records(self, chain: int, *, after_id: int, limit: int) -> list[AuditRecord]:
        """Stored events of audit chain ``chain`` with an id above ``after_id``, oldest first, at most ``limit``
        (one writer appends to a chain: its events commit in id order)."""
        ...

    async def audit_chains(self) -> list[ChainStart]:
        """Every registered audit chain (one per store instance that appended; on SQLite only chain 1), by id."""
        ...

    @property
    def history(self) -> HistoryLog:
        """The history of calls, labels and failures that policies read (``sidecar.state.history``)."""
        ...

    async def aclose(self) -> None:
        """Write queued audit events and kept writes (what the store cannot take stays in the local journal),
        then release connections and threads."""
        ...
