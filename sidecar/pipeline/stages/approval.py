"""Stage 7, approval: run only approved calls (``docs/approvals.md``).

The approval policy decides whether the call needs a person's approval. With ``approval_id`` the
approval is checked (``Approvals.check``: the exact approved call, in its conversation, approved and
unexpired); without one, a call that needs approval ends with ``APPROVAL_REQUIRED`` and a new
preview. Previews and approvals see the arguments with their sensitive values masked: the keyed
hash binds an approval to them without a preview (shown to approvers, stored) ever holding them in
clear.

A tool with a ``preview`` renderer renders the call when its preview is opened (``sidecar.tools.preview``):
the rendering is stored with the preview and covered by its hash; a renderer that fails ends the call
with its error and stores nothing. An approved call carries the approved rendering on to its handler
(``call.approved``, ``ctx.approved_preview``).

The approval is consumed later, by the consume-approval stage (8, ``sidecar.pipeline.stages.consume_approval``),
which runs after the idempotency stage (8) has claimed the call's key: a call whose key is in progress, reused
or replayed spends no approval. A call that certainly had no effect gives its approval back.

Built without ``Approvals`` (``toolbooth policy eval``), the stage opens no preview: a call that
needs approval ends with ``APPROVAL_REQUIRED`` alone.
"""

from __future__ import annotations

from typing import Any

from sidecar.contract import ErrorCode, ErrorInfo, Status, ToolResult
from sidecar.errors import CallRefused, StoreUnavailableError, refusal
from sidecar.pipeline.approvals import Approvals, CallToApprove, Refusal
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.stages.approval_guard import guarding_key, refused
from sidecar.policy import Stage
from sidecar.tools.masking import Masker
from sidecar.tools.preview import render as render_preview

__all__ = ["ApprovalStage"]


class ApprovalStage:
    """Passes on a call that needs no approval or carries a valid one."""

    def __init__(self, decider: Decider, approvals: Approvals | None = None, masker: Masker | None = None) -> None:
        assert (approvals is None) == (masker is None), "approvals need the masker of previews, and only they do"
        self._decider, self._approvals, self._masker = decider, approvals, masker

    async def run(self, call: Call, next: Next) -> ToolResult:
        decision = await self._decider.decide(call, Stage.APPROVAL)
        if call.request.approval_id and self._approvals is not None:
            call.trail["approval_id"] = call.request.approval_id
            checked = await self._approvals.check(call.request.approval_id, self._to_approve(call), decision,
                                                  key=guarding_key(call))
            if isinstance(checked, Refusal):
                raise refused(checked)
            call.approved = checked
        elif decision.required:
            preview = None
            if self._approvals is not None:
                try:
                    with call.span("store", "open_preview"):
                        preview = await self._approvals.open_preview(self._to_approve(call), decision)
                except StoreUnavailableError as exc:
                    raise CallRefused(refusal(exc, consequence="nothing was executed")) from None
            reason = preview.reason if preview else decision.reason or "this call needs a person's approval"
            raise CallRefused(ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, reason), status=Status.APPROVAL_REQUIRED,
                              preview=preview)
        return await next(call)

    def _to_approve(self, call: Call) -> CallToApprove:
        """The call to preview or compare, its sensitive values masked."""
        assert self._masker is not None
        arguments = self._masker.mask(call.validated.data, call.validated.sensitive)

        async def render() -> dict[str, Any]:
            rendered = await render_preview(call.defn, call.validated.model, call.context(call.deadline_from_now()))
            if isinstance(rendered, ErrorInfo):
                raise CallRefused(rendered)
            return rendered

        return CallToApprove(call.principal, call.defn.name, call.defn.version, arguments, call.policy_revision,
                             call.request.conversation_id, render=None if call.defn.preview is None else render)
