"""Previews and their approvals as the stores keep them, and the store methods both backends share.

A preview is the exact call an approver is shown. It moves ``pending`` -> ``approved`` | ``denied``
(``decide_preview``, once) and ``approved`` -> ``used`` (``consume_approval``, once): each move is
one conditional ``UPDATE``, so of any number of concurrent callers, in any process, one wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Protocol

from sidecar.contract import PreviewState


@dataclass(frozen=True, slots=True)
class PreviewRecord:
    """One stored preview. Times are seconds since the epoch; ``decided_by`` is the approver's
    principal as JSON (id, tenant, roles, permissions), so the approval can be re-checked later."""

    preview_id: str
    preview_hash: str
    tenant: str
    principal_id: str
    tool: str
    tool_version: str
    call_json: str  # the canonical call the hash covers
    policy_revision: str
    reason: str
    approver_roles: tuple[str, ...]
    created_at: float
    expires_at: float
    state: PreviewState = PreviewState.PENDING
    decided_by: str | None = None
    decided_at: float | None = None
    comment: str | None = None  # the approver's comment, or the reason for a denial
    used_at: float | None = None
    used_key: str | None = None  # the idempotency key of the call that used the approval, if it had one


PREVIEW_COLUMNS = tuple(f.name for f in fields(PreviewRecord))


class PreviewStore(Protocol):
    """The preview part of ``Store``."""

    async def save_preview(self, preview: PreviewRecord) -> None:
        """Store a new (pending) preview; durable on return."""
        ...

    async def get_preview(self, preview_id: str) -> PreviewRecord | None:
        """The preview with this id, if any."""
        ...

    async def list_previews(self, state: PreviewState, *, limit: int = 100) -> list[PreviewRecord]:
        """Previews in ``state``, newest first, at most ``limit``."""
        ...

    async def decide_preview(self, preview_id: str, state: PreviewState, *, decided_by: str, comment: str | None,
                             now: float) -> bool:
        """Atomically move a pending preview to ``state`` (approved or denied); ``False`` if it was not pending."""
        ...

    async def consume_approval(self, preview_id: str, *, now: float, key: str | None = None) -> bool:
        """Atomically mark an approved preview used (by the call with idempotency ``key``); ``False`` if it
        was not approved (or already used)."""
        ...


def preview_row(preview: PreviewRecord) -> tuple[Any, ...]:
    """``preview`` as a row of ``PREVIEW_COLUMNS`` (the roles as a JSON list)."""
    row = {column: getattr(preview, column) for column in PREVIEW_COLUMNS}
    row.update(approver_roles=json.dumps(list(preview.approver_roles)), state=preview.state.value)
    return tuple(row.values())


def preview_from_row(row: tuple[Any, ...]) -> PreviewRecord:
    """A row of ``PREVIEW_COLUMNS`` as a record."""
    values = dict(zip(PREVIEW_COLUMNS, row, strict=True))
    return PreviewRecord(**{**values, "approver_roles": tuple(json.loads(values["approver_roles"])),
                            "state": PreviewState(values["state"])})


def preview_sql(placeholder: str) -> dict[str, str]:
    """The preview statements, with the backend's parameter ``placeholder`` (``?`` or ``%s``)."""
    p, columns = placeholder, ", ".join(PREVIEW_COLUMNS)
    return {
        "insert": f"INSERT INTO previews ({columns}) VALUES ({', '.join([p] * len(PREVIEW_COLUMNS))})",
        "get": f"SELECT {columns} FROM previews WHERE preview_id = {p}",
        "list": f"SELECT {columns} FROM previews WHERE state = {p} "
                f"ORDER BY created_at DESC LIMIT {p}",
        "decide": f"UPDATE previews SET state = {p}, decided_by = {p}, comment = {p}, decided_at = {p} "
                  f"WHERE preview_id = {p} AND state = 'pending'",
        "consume": f"UPDATE previews SET state = 'used', used_at = {p}, used_key = {p} "
                   f"WHERE preview_id = {p} AND state = 'approved'",
    }
