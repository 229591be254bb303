"""What a caller may see and do by role: operators see every pending preview and why a policy change was refused.

The servicers stay thin by calling these instead of the pipeline's objects directly: ``create_server``
wraps the reloading engine in a ``PolicyStatusView`` and the pipeline's approvals in an ``ApprovalDesk``,
both deciding with the same ``Operators`` (``auth.operator_roles``; everyone in dev mode). ``Approvers`` says
who may sign in to the approval inbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from sidecar.config import AuthMode, AuthSettings
from sidecar.contract import ApprovalResult, Preview, Principal, ReloadStatus
from sidecar.pipeline.preview_pages import PreviewPage
from sidecar.state import AuditRecord

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "REFUSED_WITHOUT_DETAILS",
    "ApprovalDesk",
    "ApprovalGateway",
    "Approvers",
    "Operators",
    "PolicyStatusView",
    "StatusProvider",
]

DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 100, 1000
REFUSED_WITHOUT_DETAILS = "a policy change was refused; the reason is in the sidecar's log"


class Operators:
    """Who is an operator: in dev mode everyone, else a principal with one of ``auth.operator_roles``."""

    def __init__(self, auth: AuthSettings) -> None:
        self._everyone = auth.effective_mode is AuthMode.DEV
        self._roles = frozenset(auth.operator_roles)

    def includes(self, principal: Principal) -> bool:
        """Whether ``principal`` is an operator."""
        return self._everyone or not self._roles.isdisjoint(principal.roles)


class Approvers:
    """Who may sign in to the approval inbox: an operator, or a principal with one of ``approvals_ui.approver_roles``.
    What each may decide, the approver rule says per preview; someone who could decide nothing gets no session."""

    def __init__(self, operators: Operators, roles: Iterable[str]) -> None:
        self._operators, self.roles = operators, tuple(roles)
        self._roles = frozenset(self.roles)

    def includes(self, principal: Principal) -> bool:
        """Whether ``principal`` is an approver (or an operator)."""
        return self._operators.includes(principal) or not self._roles.isdisjoint(principal.roles)


class StatusProvider(Protocol):
    """The reloading engine's status (``sidecar.policy.reload.ReloadingEngine``)."""

    @property
    def status(self) -> ReloadStatus: ...


class PolicyStatusView:
    """The policy status for a caller: why a change was refused (policy source excerpts, test names)
    only for operators, everyone else learns that it was."""

    def __init__(self, provider: StatusProvider, operators: Operators) -> None:
        self._provider, self._operators = provider, operators

    def status_for(self, principal: Principal) -> ReloadStatus:
        """The status as ``principal`` may see it."""
        status = self._provider.status
        if status.last_error is not None and not self._operators.includes(principal):
            return replace(status, last_error=REFUSED_WITHOUT_DETAILS)
        return status


class ApprovalGateway(Protocol):
    """The pipeline's approvals (``sidecar.pipeline.approvals.Approvals``)."""

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult: ...

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult: ...

    async def pending(self, principal: Principal, *, all_of_them: bool, limit: int = 100, page_token: str = "",
                      tool: str | None = None, requester: str | None = None) -> PreviewPage: ...

    async def decided(self, principal: Principal, *, all_of_them: bool, limit: int = 100) -> list[Preview]: ...

    async def expired(self, principal: Principal, *, all_of_them: bool, since: float,
                      limit: int = 100) -> list[Preview]: ...

    async def visible(self, principal: Principal, preview_id: str, *, all_of_them: bool) -> Preview | None: ...

    async def calls_with(self, previews: Sequence[Preview]) -> dict[str, list[AuditRecord]]: ...


class ApprovalDesk:
    """The approvals as a caller uses them: operators list every pending preview, others those of their tenant
    they may approve (the approval policy decides), and the decided ones (operators all, others their own); a
    list or page holds ``DEFAULT_LIST_LIMIT`` unless asked, at most ``MAX_LIST_LIMIT``."""

    def __init__(self, approvals: ApprovalGateway, operators: Operators) -> None:
        self._approvals, self._operators = approvals, operators

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult:
        """Approve the preview whose hash the approver saw."""
        return await self._approvals.approve(approver, preview_id, hash_seen, comment)

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult:
        """Deny a pending preview."""
        return await self._approvals.deny(approver, preview_id, reason)

    async def pending(self, principal: Principal, limit: int = 0, page_token: str = "", *, tool: str | None = None,
                      requester: str | None = None) -> PreviewPage:
        """A page of the pending previews ``principal`` may see, newest first, after ``page_token`` (``""``: the
        newest; ``InvalidRequestError`` for a token no page gave); ``limit`` 0 means the default; only of
        ``tool`` and ``requester`` when given."""
        return await self._approvals.pending(principal, all_of_them=self._operators.includes(principal),
                                             limit=min(limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT),
                                             page_token=page_token, tool=tool, requester=requester)

    async def decided(self, principal: Principal, limit: int = 0) -> list[Preview]:
        """The decided previews ``principal`` may see (their own decisions; operators every one), the latest first."""
        return await self._approvals.decided(principal, all_of_them=self._operators.includes(principal),
                                             limit=min(limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT))

    async def expired(self, principal: Principal, since: float, limit: int = 0) -> list[Preview]:
        """The pending previews ``principal`` could have approved (as for ``pending``) that expired undecided
        after ``since`` (epoch seconds), newest first."""
        return await self._approvals.expired(principal, all_of_them=self._operators.includes(principal), since=since,
                                             limit=min(limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT))

    async def visible(self, principal: Principal, preview_id: str) -> Preview | None:
        """One preview in any state, if ``principal`` may see it (decided it, or the approver rule lets them
        decide it; operators every one), else ``None``."""
        return await self._approvals.visible(principal, preview_id, all_of_them=self._operators.includes(principal))

    async def calls_with(self, previews: Sequence[Preview]) -> dict[str, list[AuditRecord]]:
        """The audited steps of the calls sent with the approvals of ``previews`` (which the caller may see)."""
        return await self._approvals.calls_with(previews)
