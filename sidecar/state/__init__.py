"""Durable state: idempotency records (operations), previews, the audit log and the history of calls that policies
read (``history``) behind one ``Store`` protocol.

``SqlStore`` (``sql_store``) implements it once over a small SQL ``Driver`` (``driver``); a backend is a
driver plus its versioned migrations (``migrate``): SQLite (``sidecar.state.sqlite``, the default, needs
nothing installed) or PostgreSQL (``sidecar.state.postgres``) shared by replicas when
``store.postgres_dsn`` is set: ``StoreSettings.kind``. ``sidecar.state.backends`` opens each kind, and
``sidecar.state.factory.open_store`` the configured one (neither is imported here: they need
``sidecar.config``, which needs ``sidecar.config.dsn``).
"""

from __future__ import annotations

from sidecar.state.chain import ChainReport, verify_store
from sidecar.state.expiry import Expiry
from sidecar.state.history import (
    Conversation,
    EventKind,
    HistoryEvent,
    HistoryLog,
    MeterCount,
    Place,
    Reserved,
    history_scope,
)
from sidecar.state.records import (
    DEADLINE_GRACE_SECONDS,
    AuditEvent,
    AuditRecord,
    Claim,
    KeyScope,
    OperationRecord,
    PreviewCursor,
    PreviewQuery,
    PreviewRecord,
)
from sidecar.state.store import Store

__all__ = [
    "DEADLINE_GRACE_SECONDS",
    "AuditEvent",
    "AuditRecord",
    "ChainReport",
    "Claim",
    "Conversation",
    "EventKind",
    "Expiry",
    "HistoryEvent",
    "HistoryLog",
    "KeyScope",
    "MeterCount",
    "OperationRecord",
    "Place",
    "PreviewCursor",
    "PreviewQuery",
    "PreviewRecord",
    "Reserved",
    "Store",
    "history_scope",
    "verify_store",
]
