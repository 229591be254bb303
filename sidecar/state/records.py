"""The records a store keeps: idempotency records (operations) and claims, audit events, previews.

An idempotency record has one state, the public ``OperationState``: ``IN_PROGRESS`` while its call
runs, ``UNKNOWN`` once its handler outlived its deadline (``overran_at``: it may have had its effect)
or when still running ``DEADLINE_GRACE_SECONDS`` past its deadline (its sidecar died), ``COMPLETED``
or ``FAILED`` once it holds a result (success or partial success, or anything else: the handler's own,
even a late one, or an operator's resolution).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from sidecar.contract import OperationState, PreviewState, Status

__all__ = [
    "DEADLINE_GRACE_SECONDS",
    "AuditEvent",
    "AuditRecord",
    "ChainHead",
    "ChainStart",
    "Claim",
    "KeyScope",
    "OperationRecord",
    "PreviewCursor",
    "PreviewQuery",
    "PreviewRecord",
    "is_abandoned",
    "result_state",
]

# A keyed call ends (completed or released) by its deadline; one still in progress this long after it
# belonged to a sidecar that died: its outcome is unknown.
DEADLINE_GRACE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class KeyScope:
    """Idempotency keys are scoped to (principal, tool)."""

    tenant: str
    principal_id: str
    tool: str
    key: str


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """An idempotency record: the call holding a key and, once finished, its stored result."""

    scope: KeyScope
    request_id: str
    result_json: str | None
    deadline_at: float | None  # epoch seconds; ``None``: never abandoned
    created_at: float
    overran_at: float | None = None  # epoch seconds: when its handler outlived the deadline (unknown since)

    @property
    def state(self) -> OperationState:
        """Where the call stands (never ``NOT_FOUND``: that is the absence of a record)."""
        if self.result_json is not None:
            return result_state(self.result_json)
        if self.overran_at is not None or is_abandoned(self.deadline_at):
            return OperationState.UNKNOWN
        return OperationState.IN_PROGRESS


@dataclass(frozen=True, slots=True)
class Claim:
    """What claiming a key found: nothing (this call now owns it), a record of another request, or its own."""

    record: OperationRecord | None = None  # the record already holding the key, if any
    reused: bool = False  # that record is for a different request (request hash differs)

    @property
    def claimed(self) -> bool:
        """Whether the key was free: the caller owns it now and must run the call."""
        return self.record is None


def is_abandoned(deadline_at: float | None) -> bool:
    """Whether a record in progress is past ``deadline_at`` by more than the grace: its owner died."""
    return deadline_at is not None and deadline_at + DEADLINE_GRACE_SECONDS < time.time()


def result_state(result_json: str) -> OperationState:
    """``COMPLETED`` if the stored result's status is success or partial success (its effects are done; its
    errors name the parts that failed), else ``FAILED``."""
    try:
        document = json.loads(result_json)
    except ValueError:
        return OperationState.FAILED
    status = document.get("status") if isinstance(document, dict) else None
    done = status in (Status.SUCCESS.value, Status.PARTIAL_SUCCESS.value)
    return OperationState.COMPLETED if done else OperationState.FAILED


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One step of a call as the audit log records it: arguments as a hash and, masked, as JSON; with the
    decision ids and the rest of the policy input, its decisions can be exported and replayed."""

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
    decision_ids: str | None = None  # JSON: stage -> the UUID of its decision (``{}``: none; ``None``: written before)
    decision_input: str | None = None  # JSON: the policy input's principal, tool and time (``InputParts.recorded``)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A stored event, linked into its chain: ``hash`` covers the event and ``prev_hash``."""

    id: int
    event: AuditEvent
    prev_hash: str | None  # both ``None`` only for events written before the chain existed
    hash: str | None
    chain: int = 1  # the chain of the store instance that wrote it (``ChainStart``)


@dataclass(frozen=True, slots=True)
class ChainHead:
    """The newest link of an audit chain: its id, its hash and how many links the chain has up to it."""

    id: int
    hash: str
    count: int
    chain: int = 1


@dataclass(frozen=True, slots=True)
class ChainStart:
    """An audit chain, as registered when its store instance first appended: the newest event of the log
    then (``link_id``, ``link_hash``), after which its first link comes (both ``None``: after the genesis)."""

    chain: int
    link_id: int | None
    link_hash: str | None


@dataclass(frozen=True, slots=True)
class PreviewRecord:
    """One stored preview: the exact call an approver is shown. Times are seconds since the epoch;
    ``decided_by`` is the approver's principal as JSON (id, tenant, roles, permissions), so the
    approval can be re-checked later.

    It moves ``pending`` -> ``approved`` | ``denied`` (once) and ``approved`` -> ``used`` (once).
    """

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


@dataclass(frozen=True, slots=True)
class PreviewCursor:
    """A place in a listing of previews, newest first: right after the one created at ``created_at`` with
    ``preview_id`` (ties of ``created_at`` are ordered by id)."""

    created_at: float
    preview_id: str


@dataclass(frozen=True, slots=True)
class PreviewQuery:
    """Which previews a listing reads, newest first (``created_at``, then ``preview_id``, descending), at most
    ``limit``: those in ``state`` of ``tenant`` (``None``: every tenant), expiring after ``expires_after`` and
    at most at ``expires_by``, created after ``created_after``, listed after ``after`` (``None``: the newest);
    only of ``tool`` and of the requester ``principal_id`` when given."""

    state: PreviewState
    limit: int
    tenant: str | None = None
    expires_after: float = -math.inf
    expires_by: float = math.inf
    created_after: float = -math.inf
    after: PreviewCursor | None = None
    tool: str | None = None
    principal_id: str | None = None
