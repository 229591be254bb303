"""Durable state: idempotency records and audit events behind one ``Store`` protocol.

SQLite (``sidecar.state.sqlite``) is the default; it needs nothing installed. Replicas share
PostgreSQL (``sidecar.state.postgres``) when ``store.postgres_dsn`` is set; ``factory.open_store`` picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from sidecar.state.previews import PreviewStore

if TYPE_CHECKING:
    from sidecar.state.idempotency import OperationRecord



@dataclass(frozen=True, slots=True)
class KeyScope:
    """Idempotency keys are scoped to (principal, tool)."""

    tenant: str
    principal_id: str
    tool: str
    key: str


class ClaimState(StrEnum):
    """What claiming an idempotency key found."""

    CLAIMED = "claimed"  # new key: the caller owns it and must run the handler
    REPLAY = "replay"  # same key, same request, finished: ``result_json`` holds the stored result
    IN_PROGRESS = "in_progress"  # same key, same request, still running
    REUSED = "reused"  # same key, different request
    UNKNOWN = "unknown"  # same key, same request, still "running" well past its deadline: its sidecar died


@dataclass(frozen=True, slots=True)
class Claim:
    state: ClaimState
    result_json: str | None = None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One step of a call as the audit log records it: arguments as a hash and, masked, as JSON."""

    request_id: str
    time: str
    principal_id: str
    tenant: str
    tool: str
    tool_version: str
    input_hash: str
    decisions_json: str
    policy_revision: str
    idempotency_key: str | None
    call_id: str | None
    conversation_id: str | None
    status: str
    error_code: str | None
    duration_ms: int
    arguments_json: str | None = None  # the validated arguments, sensitive values masked (``sidecar.tools.masking``)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A stored event, linked into its store's chain: ``hash`` covers the event and ``prev_hash``."""

    id: int
    event: AuditEvent
    prev_hash: str | None  # both ``None`` only for events written before the chain existed
    hash: str | None


class Store(PreviewStore, Protocol):
    """Idempotency records, previews with their approvals (``PreviewStore``) and audit events."""

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str, *,
                    deadline_at: float | None = None) -> Claim:
        """Atomically claim ``scope`` for ``request_hash`` or report what holds it.

        ``deadline_at`` (epoch seconds) bounds the call claiming: a record still in progress
        ``DEADLINE_GRACE_SECONDS`` after it is reported ``UNKNOWN``; ``None`` never expires.
        """
        ...

    async def complete(self, scope: KeyScope, result_json: str) -> None:
        """Store the final result of a claimed key."""
        ...

    async def release(self, scope: KeyScope) -> None:
        """Forget a claimed key whose call certainly had no effect."""
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

    async def record_audit(self, event: AuditEvent) -> None:
        """Append ``event`` to the audit log; durable on return."""
        ...

    def queue_audit(self, event: AuditEvent) -> None:
        """Like ``record_audit``, but written soon in a batch (in order); write failures are logged."""
        ...

    async def flush_audit(self) -> None:
        """Wait until every queued audit event is written."""
        ...

    async def audit_records(self, *, after_id: int = 0, limit: int | None = None,
                            newest_first: bool = False) -> list[AuditRecord]:
        """Stored events with an id above ``after_id``, oldest first (or newest first), at most ``limit``."""
        ...

    async def audit_mask_key(self, candidate: bytes) -> bytes:
        """The store's key for masking audited values; ``candidate`` becomes it if it has none yet."""
        ...

    async def aclose(self) -> None:
        """Release connections and threads."""
        ...
