"""A stored preview as callers see it (``to_preview``), and what the checks of an approval read from one."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from sidecar.canonical import canonical_json, hash_matches
from sidecar.contract import Preview, Principal, Requester
from sidecar.state import PreviewCursor, PreviewRecord

__all__ = ["cursor_of", "same_principal", "stored_call", "to_preview"]

log = logging.getLogger("toolbooth.approvals")


def cursor_of(record: PreviewRecord) -> PreviewCursor:
    """Where a listing that read ``record`` goes on from."""
    return PreviewCursor(record.created_at, record.preview_id)


def same_principal(principal: Principal, decided_by: str) -> bool:
    """Whether the approver stored as ``decided_by`` (a principal as JSON) is ``principal`` (same id and tenant)."""
    return Principal.model_validate_json(decided_by).identity == principal.identity


def stored_call(record: PreviewRecord) -> dict[str, Any] | None:
    """``record``'s canonical call, if it still hashes to the preview's hash (else it was changed: logged)."""
    try:
        call = json.loads(record.call_json)
        intact = isinstance(call, dict) and hash_matches(call, record.preview_hash)
    except ValueError:  # not JSON, or JSON without a canonical form
        intact = False
    if not intact:
        log.error("preview %s: its stored call no longer hashes to its preview hash; refused", record.preview_id)
        return None
    return call  # type: ignore[no-any-return]


def to_preview(record: PreviewRecord) -> Preview:
    """A stored preview as callers see it: times in RFC 3339, the approver by id, the tool's rendering apart."""
    decided_by = None if record.decided_by is None else json.loads(record.decided_by)["id"]
    return Preview(preview_id=record.preview_id, preview_hash=record.preview_hash, call_json=record.call_json,
                   reason=record.reason, expires_at=_rfc3339(record.expires_at), state=record.state,
                   approver_roles=record.approver_roles, decided_by=decided_by,
                   decided_at=None if record.decided_at is None else _rfc3339(record.decided_at),
                   comment=record.comment, rendering_json=_rendering_json(record.call_json),
                   created_at=_rfc3339(record.created_at), tool=record.tool,
                   requested_by=Requester(id=record.principal_id, tenant=record.tenant))


def _rendering_json(call_json: str) -> str | None:
    try:
        call = json.loads(call_json)
    except ValueError:
        return None
    rendering = call.get("rendering") if isinstance(call, dict) else None
    return None if rendering is None else canonical_json(rendering)


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
