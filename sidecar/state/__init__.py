"""Durable state: idempotency records and audit events behind one ``Store`` protocol.

SQLite (``sidecar.state.sqlite``) is the default; it needs nothing installed. Replicas share
PostgreSQL (``sidecar.state.postgres``) when ``store.postgres_dsn`` is set; ``factory.open_store`` picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class StoreUnavailableError(RuntimeError):
    """The store cannot be read or written; nothing may execute."""


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


@dataclass(frozen=True, slots=True)
class Claim:
    state: ClaimState
    result_json: str | None = None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One call as the audit log records it (arguments only as a hash)."""

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


class Store(Protocol):
    """Idempotency records and audit events."""

    async def claim(self, scope: KeyScope, request_hash: str, request_id: str) -> Claim:
        """Atomically claim ``scope`` for ``request_hash`` or report what holds it."""
        ...

    async def complete(self, scope: KeyScope, result_json: str) -> None:
        """Store the final result of a claimed key."""
        ...

    async def release(self, scope: KeyScope) -> None:
        """Forget a claimed key whose call certainly had no effect."""
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

    async def aclose(self) -> None:
        """Release connections and threads."""
        ...
