"""Approvals bound to the exact call (stage 7 of a call, ``sidecar.pipeline.order``; ``docs/approvals.md``).

A call the approval policy holds gets a preview: the canonical call (tool, version, validated
arguments, requesting principal, conversation, policy revision), its hash, a random id and an
expiry. An approver approves that hash (``data.toolbooth.approval.approver`` decides who may); the
later ``ExecuteTool`` with ``approval_id`` runs only if its own canonical call hashes the same
(``check``), and consumes the approval atomically right before it runs, once its idempotency key
is claimed (``consume``): one approval, one run. A call that certainly had no effect gives its
approval back (``restore``).

A tool with a ``preview`` renderer adds what the call will do (``CallToApprove.render``: the rendered
email, the task) to the canonical call, under ``rendering``: the approver sees it, the hash covers it,
and ``check`` hands the stored rendering to the call (``Approved.rendering``), for the handler to act on
exactly it. A stored preview whose content no longer hashes to its hash (changed after it was stored)
is neither approved nor executed.

Listings (``pending``, ``expired``, ``decided``) read the caller's tenant (operators: every tenant), filtered
in the store, newest first, a page at a time (``preview_pages``); the approver rule decides within each page.
A principal holds at most ``max_pending`` unexpired pending previews: past it, a call that needs approval is
refused (``RATE_LIMITED``) and stores nothing, so that no one fills the approvers' lists.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from sidecar.canonical import canonical_json
from sidecar.contract import ApprovalResult, ErrorCode, ErrorInfo, Preview, PreviewState, Principal
from sidecar.display import is_blank
from sidecar.errors import CallRefused, DependencyError, refusal
from sidecar.metrics import Metrics
from sidecar.pipeline.approval_audit import calls_with, decision_event
from sidecar.pipeline.approval_calls import (
    CHANGED,
    Approved,
    CallToApprove,
    Refusal,
    approval_error,
    mismatch,
    preview_hash,
    unusable,
)
from sidecar.pipeline.fields import malformed_field
from sidecar.pipeline.preview_pages import PreviewPage, page_token, read_token
from sidecar.pipeline.preview_records import cursor_of, same_principal, stored_call, to_preview
from sidecar.policy import Decision, PolicyEngine, Stage
from sidecar.policy.decision import MAX_PREVIEW_TTL_SECONDS
from sidecar.policy.input import PolicyInput, now_utc
from sidecar.state import AuditRecord, PreviewCursor, PreviewQuery, PreviewRecord, Store

__all__ = [
    "DEFAULT_APPROVER_ROLES",
    "DEFAULT_PREVIEW_TTL_SECONDS",
    "Approvals",
    "Approved",
    "CallToApprove",
    "Refusal",
    "preview_hash",
]

log = logging.getLogger("toolbooth.approvals")
DEFAULT_PREVIEW_TTL_SECONDS = 15 * 60
DEFAULT_APPROVER_ROLES = ("approver",)
READ_PER_PAGE = 2000  # previews a page reads at most (each the approver rule decides), then it ends early
READ_BATCH = 200  # previews a page reads from the store at once, at least (the approver rule may keep few)


class Approvals:
    """Opens previews, records approvers' decisions, redeems approvals; a principal holds at most ``max_pending``
    pending previews (``limits.max_pending_previews_per_principal``). Previews expire by ``clock`` (epoch seconds;
    tests move it on)."""

    def __init__(self, store: Store, policy: PolicyEngine, metrics: Metrics | None = None, *,
                 max_pending: int, clock: Callable[[], float] = time.time) -> None:
        self.store, self.policy, self._metrics, self._max_pending = store, policy, metrics, max_pending
        self._clock = clock

    async def open_preview(self, call: CallToApprove, decision: Decision) -> Preview:
        """Store a pending preview of ``call``, with the tool's rendering of it (``CallRefused`` with the error
        if it cannot render, or ``RATE_LIMITED`` if its principal holds ``max_pending`` pending previews already:
        nothing is stored; ``StoreUnavailableError`` if it cannot be stored)."""
        canonical = call.canonical(rendering=None if call.render is None else await call.render())
        now = self._clock()
        record = PreviewRecord(
            preview_id=secrets.token_hex(24), preview_hash=preview_hash(canonical), tenant=call.principal.tenant,
            principal_id=call.principal.id, tool=call.tool, tool_version=call.version,
            call_json=canonical_json(canonical), policy_revision=call.policy_revision,
            reason=decision.reason or "this call needs a person's approval",
            approver_roles=decision.approver_roles or DEFAULT_APPROVER_ROLES, created_at=now,
            expires_at=now + (decision.preview_ttl_seconds or DEFAULT_PREVIEW_TTL_SECONDS))
        if not await self.store.save_preview(record, max_pending=self._max_pending):
            raise CallRefused(_too_many_pending(self._max_pending))
        return to_preview(record)

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult:
        """Approve ``preview_id`` if ``approver`` may and ``hash_seen`` is its hash (audited either way, unless a
        field is malformed: that is refused before anything is read or written)."""
        if error := malformed_field(preview_id=preview_id, preview_hash=hash_seen, comment=comment):
            return _refused(error)
        return await self._decide(approver, preview_id, PreviewState.APPROVED, comment, hash_seen)

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult:
        """Deny ``preview_id`` if ``approver`` may; ``reason`` is required (a malformed field is refused as in
        ``approve``)."""
        if error := malformed_field(preview_id=preview_id, reason=reason):
            return _refused(error)
        if is_blank(reason):  # a reason of zero-width spaces says nothing either
            return _refused(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "a denial needs a reason", field="reason"))
        return await self._decide(approver, preview_id, PreviewState.DENIED, reason, None)

    async def pending(self, principal: Principal, *, all_of_them: bool, limit: int = 100, page_token: str = "",
                      tool: str | None = None, requester: str | None = None) -> PreviewPage:
        """A page of the unexpired pending previews ``principal`` may approve, of their tenant (``all_of_them``:
        every one, for operators), newest first, after ``page_token`` (``InvalidRequestError`` if it is not
        one a page gave); only of ``tool`` and ``requester`` (a principal id) when given."""
        now = self._clock()
        query = PreviewQuery(PreviewState.PENDING, _batch(limit), tenant=None if all_of_them else principal.tenant,
                             expires_after=now, created_after=now - MAX_PREVIEW_TTL_SECONDS,
                             after=read_token(page_token), tool=tool, principal_id=requester)
        return await self._page(principal, all_of_them, query, limit)

    async def expired(self, principal: Principal, *, all_of_them: bool, since: float,
                      limit: int = 100) -> list[Preview]:
        """Pending previews ``principal`` could have approved, of their tenant (as for ``pending``), that expired
        undecided after ``since`` (epoch seconds), newest first, at most ``limit``."""
        query = PreviewQuery(PreviewState.PENDING, _batch(limit), tenant=None if all_of_them else principal.tenant,
                             expires_after=since, expires_by=self._clock(),
                             created_after=since - MAX_PREVIEW_TTL_SECONDS)
        return (await self._page(principal, all_of_them, query, limit)).previews

    async def visible(self, principal: Principal, preview_id: str, *, all_of_them: bool) -> Preview | None:
        """The preview ``preview_id`` in any state (expired, decided too), if ``principal`` may see it: if they
        decided it, or the approver rule lets them decide it (as for ``pending``); every one for operators
        (``all_of_them``)."""
        record = None if malformed_field(preview_id=preview_id) else await self.store.get_preview(preview_id)
        if record is None or all_of_them:
            return None if record is None else to_preview(record)
        mine = record.decided_by is not None and same_principal(principal, record.decided_by)
        return to_preview(record) if mine or (await self._approver_decision(principal, record)).allow else None

    async def calls_with(self, previews: Sequence[Preview]) -> dict[str, list[AuditRecord]]:
        """The audited steps of the calls sent with each of ``previews``' approvals (``approval_audit``)."""
        return await calls_with(self.store, previews)

    async def _page(self, principal: Principal, all_of_them: bool, query: PreviewQuery, limit: int) -> PreviewPage:
        """Up to ``limit`` of the previews ``query`` reads (in batches of ``query.limit``) that ``principal`` may
        decide, and the token after the last one read when more may follow; ``READ_PER_PAGE`` read at most."""
        kept: list[Preview] = []
        cursors: list[PreviewCursor] = []
        read = 0
        while True:
            records = await self.store.previews(query)
            for record in records:
                if len(kept) == limit or read == READ_PER_PAGE:  # and another is there: the next page starts here
                    assert query.after is not None  # one was read: ``limit`` is at least 1
                    return PreviewPage(kept, page_token(query.after), cursors)
                read += 1
                query = replace(query, after=cursor_of(record))
                if all_of_them or (await self._approver_decision(principal, record)).allow:
                    kept.append(to_preview(record))
                    cursors.append(cursor_of(record))
            if len(records) < query.limit:
                return PreviewPage(kept, cursors=cursors)

    async def decided(self, principal: Principal, *, all_of_them: bool, limit: int = 100) -> list[Preview]:
        """Previews that were decided (approved, denied, or approved and then used by their call), the latest
        decision first: those ``principal`` decided, or every one (``all_of_them``, for operators); of each
        state the ``limit`` newest are looked at."""
        tenant = None if all_of_them else principal.tenant
        records = [r for state in _DECIDED for r in await self.store.previews(PreviewQuery(state, limit, tenant))]
        if not all_of_them:
            records = [r for r in records if r.decided_by is not None and same_principal(principal, r.decided_by)]
        records.sort(key=lambda r: r.decided_at or 0.0, reverse=True)
        return [to_preview(r) for r in records[:limit]]

    async def check(self, approval_id: str, call: CallToApprove, decision: Decision, *,
                    key: str | None = None) -> Refusal | Approved:
        """Whether the approval ``approval_id`` lets ``call`` go on (``decision``: the approval policy's, now);
        ``Approved`` (with the approved rendering) when it may, to its claim and ``consume``. Nothing is
        consumed here. ``key``: the idempotency key that will guard the call, if any; a retry with the key of
        the call that used the approval goes on, for that key to replay its result (``consume`` refuses it if
        the key's record is gone). A stored preview changed since it was stored refuses; so does a failing
        store or policy (fail closed)."""
        try:
            return await self._check(approval_id, call, decision, key)
        except DependencyError as exc:  # fail closed: refuse, nothing changes
            return Refusal(_failure(exc, f"checking approval {approval_id}"))

    async def consume(self, approval_id: str, *, key: str | None = None) -> Refusal | None:
        """Mark the checked approval used by the call with idempotency ``key``, atomically: of any number
        of calls, on any sidecar sharing the store, one gets ``None`` and runs. A failing store refuses."""
        try:
            if await self.store.consume_approval(approval_id, now=self._clock(), key=key):
                return None
            record = await self.store.get_preview(approval_id)
        except DependencyError as exc:  # fail closed: refuse, nothing changes
            return Refusal(_failure(exc, f"consuming approval {approval_id}"))
        if record is not None and key is not None and record.used_key == key:
            return Refusal(approval_error(ErrorCode.PERMISSION_DENIED, "this approval was already used by the call "
                                          "with this idempotency key, whose stored result has expired; it does not "
                                          "run again"))
        return Refusal(approval_error(ErrorCode.PERMISSION_DENIED, "this approval was already used"))

    async def restore(self, approval_id: str) -> None:
        """Give back the approval a call consumed and certainly had no effect with (it never ran, or its tool
        said nothing happened), so that a retry may use it while it is unexpired. A failing store keeps
        it used: a retry is then refused, never run twice."""
        try:
            await self.store.restore_approval(approval_id)
        except DependencyError as exc:
            log.error("could not give back approval %s: %s", approval_id, exc)

    async def _check(self, approval_id: str, call: CallToApprove, decision: Decision,
                     key: str | None) -> Refusal | Approved:
        record = await self.store.get_preview(approval_id)
        if record is None:
            return Refusal(approval_error(ErrorCode.RESOURCE_NOT_FOUND, "there is no approval with this id"))
        stored = stored_call(record)
        if stored is None:
            return Refusal(approval_error(ErrorCode.PERMISSION_DENIED, CHANGED))
        if refusal := mismatch(record, stored, call):
            return refusal
        approved = Approved(stored.get("rendering"))
        if record.state is PreviewState.USED and key is not None and record.used_key == key:
            return approved  # a retry of the call that used it: its idempotency record replays, never runs it twice
        if refusal := unusable(record, now=self._clock()):
            return refusal
        if "conversation_id" not in stored or (call.render is not None and approved.rendering is None):
            fresh = await self.open_preview(call, decision)
            what = "approvals were bound to a conversation" if "conversation_id" not in stored else (
                "the tool rendered its calls for approval")
            return Refusal(ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, f"this approval was granted before {what}; "
                                        "it no longer suffices: " + fresh.reason), fresh)
        if record.policy_revision != call.policy_revision and not await self._still_counts(record, decision):
            fresh = await self.open_preview(call, decision)
            return Refusal(ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, "the policy changed since this approval and "
                                        "it no longer suffices: " + fresh.reason), fresh)
        return approved

    async def _still_counts(self, record: PreviewRecord, decision: Decision) -> bool:
        """Under a new policy revision: an approval counts if approval is no longer required, or if its
        approver may still approve the call with the approver roles the new decision names."""
        if not decision.required:
            return True
        assert record.decided_by is not None  # approved
        approver = Principal.model_validate_json(record.decided_by)
        roles = decision.approver_roles or DEFAULT_APPROVER_ROLES
        return (await self._approver_decision(approver, record, approver_roles=roles)).allow

    async def _decide(self, approver: Principal, preview_id: str, state: PreviewState, comment: str | None,
                      hash_seen: str | None) -> ApprovalResult:
        """Decide, then queue the audit event of the attempt (whatever its outcome)."""
        started, record = time.monotonic(), None
        try:
            record = await self.store.get_preview(preview_id)
            result = await self._decide_or_refuse(approver, preview_id, record, state, comment, hash_seen)
        except DependencyError as exc:  # fail closed: refuse, nothing changes
            result = _refused(_failure(exc, f"deciding preview {preview_id}"))
        if self._metrics is not None:
            self._metrics.approval(state.value if result.ok else "refused")
        action = {"preview_id": preview_id, "decision": state.value, "comment": comment}
        self.store.queue_audit(decision_event(approver, record, action, result, self.policy.revision, started))
        return result

    async def _decide_or_refuse(self, approver: Principal, preview_id: str, record: PreviewRecord | None,
                                state: PreviewState, comment: str | None, hash_seen: str | None) -> ApprovalResult:
        if record is None:
            return _refused(ErrorInfo.of(ErrorCode.RESOURCE_NOT_FOUND, "there is no preview with this id",
                                         field="preview_id"))
        allowed = await self._approver_decision(approver, record)
        if not allowed.allow:
            return _refused(ErrorInfo.of(ErrorCode.PERMISSION_DENIED, allowed.reason or "you may not decide this"))
        if record.expires_at <= self._clock():
            return _refused(ErrorInfo.of(ErrorCode.PREVIEW_EXPIRED, "the preview expired", field="preview_id"),
                            record)
        if hash_seen is not None and not hmac.compare_digest(hash_seen.encode(), record.preview_hash.encode()):
            return _refused(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "preview_hash is not the hash of this preview",
                                         field="preview_hash"), record)
        if state is PreviewState.APPROVED and stored_call(record) is None:
            return _refused(ErrorInfo.of(ErrorCode.PERMISSION_DENIED, CHANGED, field="preview_id"))
        decided_by = approver.model_dump_json()
        if not await self.store.decide_preview(preview_id, state, decided_by=decided_by, comment=comment or None,
                                               now=self._clock()):
            current = await self.store.get_preview(preview_id) or record
            return _refused(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, f"the preview is already {current.state}",
                                         field="preview_id"), current)
        log.info("preview %s %s by %s", preview_id, state, approver.id)
        return ApprovalResult(ok=True, preview=to_preview(await self.store.get_preview(preview_id) or record))

    async def _approver_decision(self, approver: Principal, record: PreviewRecord, *,
                                 approver_roles: tuple[str, ...] | None = None) -> Decision:
        """``data.toolbooth.approval.approver`` for ``approver`` and ``record`` (never cached)."""
        preview = {"preview_id": record.preview_id, "tool": record.tool, "tool_version": record.tool_version,
                   "reason": record.reason, "requested_by": {"id": record.principal_id, "tenant": record.tenant},
                   "approver_roles": list(approver_roles or record.approver_roles)}
        document = {"principal": approver.model_dump(mode="json"), "preview": preview,
                    "context": {"stage": Stage.APPROVER.value, "time": now_utc()}}
        return await self.policy.decide(Stage.APPROVER, PolicyInput.of(document))


def _batch(limit: int) -> int:
    """How many previews a listing of ``limit`` reads from the store at once: one more than a page (to know
    whether another follows), and at least ``READ_BATCH``, for a rule that keeps few takes few round trips."""
    return max(limit + 1, READ_BATCH)


_DECIDED = (PreviewState.APPROVED, PreviewState.USED, PreviewState.DENIED)
def _too_many_pending(max_pending: int) -> ErrorInfo:
    return ErrorInfo.of(ErrorCode.RATE_LIMITED, f"this principal already has {max_pending} calls waiting for a "
                        "person's approval, the most it may have; nothing was stored. Wait until an approver has "
                        "decided some of them (or they expired), then send this call again",
                        details={"max_pending_previews": max_pending})


def _failure(exc: DependencyError, doing: str) -> ErrorInfo:
    """The typed error of a failing store or approver policy; the details go to the log only."""
    log.error("%s failed: %s", doing, exc)
    return refusal(exc, consequence="nothing was done")


def _refused(error: ErrorInfo, record: PreviewRecord | None = None) -> ApprovalResult:
    return ApprovalResult(ok=False, error=error, preview=None if record is None else to_preview(record))
