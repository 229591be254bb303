"""Records as table rows and back: the column order every statement of ``SqlStore`` uses."""

from __future__ import annotations

import json
import operator
from dataclasses import fields
from typing import Any

from sidecar.contract import PreviewState
from sidecar.state.chain import EVENT_COLUMNS
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent, AuditRecord, KeyScope, OperationRecord, PreviewRecord

__all__ = [
    "CHAINED_COLUMNS",
    "OPERATION_COLUMNS",
    "PREVIEW_COLUMNS",
    "audit_record",
    "audit_row",
    "operation_record",
    "preview_record",
    "preview_row",
]

CHAINED_COLUMNS = (*EVENT_COLUMNS, "prev_hash", "hash")
# ``created_at`` last: a statement reads it as epoch seconds (``Dialect.epoch``).
OPERATION_COLUMNS = ("tenant", "principal_id", "tool", "key", "request_id", "result_json", "deadline_at", "overran_at",
                     "created_at")
PREVIEW_COLUMNS = tuple(f.name for f in fields(PreviewRecord))
_event_values = operator.attrgetter(*EVENT_COLUMNS)  # an event's values in column order, in one call


def audit_row(event: AuditEvent) -> Row:
    """``event`` as a row of ``EVENT_COLUMNS``."""
    return _event_values(event)


def audit_record(row: Row) -> AuditRecord:
    """A row of ``id``, ``chain_id`` and ``CHAINED_COLUMNS`` as a record."""
    ident, chain, *values = row
    count = len(EVENT_COLUMNS)
    prev_hash, digest = values[count:]
    return AuditRecord(int(ident), AuditEvent(*values[:count]), prev_hash, digest, int(chain))


def operation_record(row: Row) -> OperationRecord:
    """A row of ``OPERATION_COLUMNS`` as a record."""
    tenant, principal_id, tool, key, request_id, result_json, deadline_at, overran_at, created_at = row
    return OperationRecord(KeyScope(str(tenant), str(principal_id), str(tool), str(key)), str(request_id),
                           result_json, _epoch(deadline_at), float(created_at), overran_at=_epoch(overran_at))


def _epoch(value: Any) -> float | None:
    return None if value is None else float(value)


def preview_row(preview: PreviewRecord) -> Row:
    """``preview`` as a row of ``PREVIEW_COLUMNS`` (the roles as a JSON list)."""
    row = {column: getattr(preview, column) for column in PREVIEW_COLUMNS}
    row.update(approver_roles=json.dumps(list(preview.approver_roles)), state=preview.state.value)
    return tuple(row.values())


def preview_record(row: Row) -> PreviewRecord:
    """A row of ``PREVIEW_COLUMNS`` as a record."""
    values = dict(zip(PREVIEW_COLUMNS, row, strict=True))
    return PreviewRecord(**{**values, "approver_roles": tuple(json.loads(values["approver_roles"])),
                            "state": PreviewState(values["state"])})
