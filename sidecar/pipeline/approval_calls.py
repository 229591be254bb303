"""What an approval is bound to (``CallToApprove``, ``preview_hash``) and the checks that redeem it: the call
must be exactly the previewed one (``mismatch``) and its approval approved, unexpired and unused (``unusable``)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sidecar.canonical import hash_matches, sha256_hex
from sidecar.contract import ErrorCode, ErrorInfo, Preview, PreviewState, Principal
from sidecar.pipeline.preview_records import to_preview
from sidecar.state import PreviewRecord

__all__ = ["CHANGED", "Approved", "CallToApprove", "Refusal", "approval_error", "mismatch", "preview_hash",
           "unusable"]

@dataclass(frozen=True, slots=True)
class CallToApprove:
    """What an approval is bound to: one validated call by one principal under one policy revision, and,
    for a tool that renders its calls, ``render``: its rendering of this one (``CallRefused`` if it fails)."""

    principal: Principal
    tool: str
    version: str
    arguments: dict[str, Any]  # validated, as JSON data
    policy_revision: str
    conversation_id: str | None = None
    render: Callable[[], Awaitable[dict[str, Any]]] | None = None

    def canonical(self, policy_revision: str | None = None, *, bound: bool = True,
                  rendering: dict[str, Any] | None = None) -> dict[str, Any]:
        """The canonical call (with another ``policy_revision`` to compare with an older preview; not
        ``bound`` to its conversation to compare with a preview stored before previews were; with the
        tool's ``rendering`` of it, if any)."""
        canonical: dict[str, Any] = {
            "tool": self.tool, "version": self.version, "arguments": self.arguments,
            "principal": {"id": self.principal.id, "tenant": self.principal.tenant},
            "policy_revision": self.policy_revision if policy_revision is None else policy_revision}
        if bound:
            canonical["conversation_id"] = self.conversation_id
        return canonical if rendering is None else {**canonical, "rendering": rendering}


def preview_hash(canonical: dict[str, Any]) -> str:
    """``sha256:`` + hex over the canonical JSON of a canonical call: equal for any key order."""
    return sha256_hex(canonical)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an approved call may not run; ``preview`` is the one to approve (with ``APPROVAL_REQUIRED``)."""

    error: ErrorInfo
    preview: Preview | None = None


@dataclass(frozen=True, slots=True)
class Approved:
    """An approval that lets its call go on; ``rendering``: the tool's rendering the approver approved."""

    rendering: dict[str, Any] | None = None


CHANGED = ("the stored preview no longer matches its hash: it was changed after it was made, so it is neither "
            "approved nor run; ask for a new approval")


def mismatch(record: PreviewRecord, stored: dict[str, Any], call: CallToApprove) -> Refusal | None:
    """A refusal unless ``call`` is exactly the previewed call (under the preview's policy revision, with the
    stored rendering)."""
    if (record.tenant, record.principal_id) != call.principal.identity:
        return Refusal(approval_error(ErrorCode.PERMISSION_DENIED, "this approval is for another principal's call"))
    bound = "conversation_id" in stored
    canonical = call.canonical(record.policy_revision, bound=bound, rendering=stored.get("rendering"))
    # A preview stored before previews were bound to a conversation was hashed before RFC 8785 too.
    matches = hash_matches(canonical, record.preview_hash) if not bound else hmac.compare_digest(
        preview_hash(canonical), record.preview_hash)
    if not matches:
        return Refusal(approval_error(ErrorCode.INVALID_ARGUMENT, "the call differs from the approved one (tool, "
                                      "version, arguments or conversation); send exactly the approved call"))
    return None


def unusable(record: PreviewRecord, *, now: float) -> Refusal | None:
    """A refusal unless ``record`` is an approved, unused approval unexpired at ``now`` (epoch seconds)."""
    if record.state is PreviewState.DENIED:
        return Refusal(approval_error(ErrorCode.PERMISSION_DENIED, f"an approver denied this call: {record.comment}"))
    if record.state is PreviewState.USED:
        return Refusal(approval_error(ErrorCode.PERMISSION_DENIED, "this approval was already used"))
    if record.expires_at <= now:
        return Refusal(approval_error(ErrorCode.PREVIEW_EXPIRED, "the preview expired before the call ran"))
    if record.state is PreviewState.PENDING:
        return Refusal(ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, "this call is not approved yet"), to_preview(record))
    return None


def approval_error(code: ErrorCode, message: str) -> ErrorInfo:
    """An error about the request's ``approval_id``."""
    return ErrorInfo.of(code, message, field="approval_id")
