"""What the approval stage (7) and the consume-approval stage (9) share: the key that guards an approved call
and the refusal of an approval that may not be used."""

from __future__ import annotations

from sidecar.contract import Status
from sidecar.errors import CallRefused
from sidecar.pipeline.approvals import Refusal
from sidecar.pipeline.call import Call

__all__ = ["guarding_key", "refused"]


def guarding_key(call: Call) -> str | None:
    """The idempotency key that guards ``call``, if its tool has one."""
    return call.request.idempotency_key if call.defn.requires_idempotency_key else None


def refused(denied: Refusal) -> CallRefused:
    """The refusal of a call whose approval may not be used (``APPROVAL_REQUIRED`` with the preview to approve)."""
    status = Status.APPROVAL_REQUIRED if denied.preview is not None else Status.ERROR
    return CallRefused(denied.error, status=status, preview=denied.preview)
