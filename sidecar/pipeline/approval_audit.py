"""Approvals in the audit log: an approver's decision as an event, and the calls later sent with an approval.

``decision_event`` is the audit event of an approver's attempt (``ApproveOperation``/``DenyOperation``), which
``is_decision_event`` tells from a call's. A
call sent with ``approval_id`` records it in its audit trail (``decisions_json``), whether it then ran or
was refused; ``calls_with`` reads those steps from the audit log (``Store.approval_audit``) for a page of
decided previews, from the moment the oldest of them was held, at most ``CALLS_LOOKBACK`` steps: what the
history of decisions shows became of each approved call.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Sequence
from typing import Any

from sidecar.canonical import canonical_json
from sidecar.contract import ApprovalResult, Preview, Principal
from sidecar.ids import random_uuid_hex
from sidecar.state import AuditEvent, AuditRecord, PreviewRecord, Store

__all__ = ["CALLS_LOOKBACK", "calls_with", "decision_event", "is_decision_event"]

CALLS_LOOKBACK = 10_000  # the newest audited steps of calls sent with an approval that are read
_APPROVER = "approver"  # the one key of an approver's attempt's decisions_json


async def calls_with(store: Store, previews: Sequence[Preview], *,
                     limit: int = CALLS_LOOKBACK) -> dict[str, list[AuditRecord]]:
    """The audited steps of the calls sent with each of ``previews``' approvals (the agent's retries: the one
    that ran, and any refused), oldest first, by preview id; read since the oldest of ``previews`` was held."""
    wanted = {p.preview_id for p in previews}
    if not wanted:
        return {}
    held = min(_epoch(p.created_at or p.expires_at) for p in previews)
    since = dt.datetime.fromtimestamp(held - 1, dt.UTC).isoformat(timespec="milliseconds")
    calls: dict[str, list[AuditRecord]] = {}
    for record in reversed(await store.approval_audit(since, limit=limit)):
        approval_id = _approval_of(record.event)
        if approval_id in wanted:
            calls.setdefault(approval_id, []).append(record)
    return calls


def decision_event(approver: Principal, record: PreviewRecord | None, action: dict[str, Any], result: ApprovalResult,
                   revision: str, started: float) -> AuditEvent:
    """An approver's attempt as an audit event: status ``approved``/``denied``, or ``refused`` with its code."""
    return AuditEvent(
        request_id=random_uuid_hex(), time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        principal_id=approver.id, tenant=approver.tenant, tool=record.tool if record else "",
        tool_version=record.tool_version if record else "", input_hash=record.preview_hash if record else "",
        decisions_json=canonical_json({_APPROVER: action}), policy_revision=revision, idempotency_key=None,
        call_id=None, conversation_id=None, status=action["decision"] if result.ok else "refused",
        error_code=result.error.code.value if result.error else None,
        duration_ms=round((time.monotonic() - started) * 1000))


def is_decision_event(event: AuditEvent) -> bool:
    """Whether ``event`` is an approver's attempt (``decision_event``), not a call's step."""
    try:
        decisions = json.loads(event.decisions_json)
    except ValueError:
        return False
    return isinstance(decisions, dict) and decisions.keys() == {_APPROVER}


def _approval_of(event: AuditEvent) -> str | None:
    """The approval id the audited call was sent with (its trail's ``approval_id``), if any."""
    try:
        trail = json.loads(event.decisions_json)
    except ValueError:
        return None
    approval_id = trail.get("approval_id") if isinstance(trail, dict) else None
    return approval_id if isinstance(approval_id, str) else None


def _epoch(rfc3339: str) -> float:
    return dt.datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
