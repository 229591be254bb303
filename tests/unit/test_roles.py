"""What a caller may see and do by role: operators, the policy status view, the approval desk."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config import parse_settings
from sidecar.contract import ApprovalResult, Principal, ReloadStatus
from sidecar.pipeline.preview_pages import PreviewPage
from sidecar.server.roles import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    REFUSED_WITHOUT_DETAILS,
    ApprovalDesk,
    Operators,
    PolicyStatusView,
)

JWT = {"jwt": {"issuer": "i", "audience": "a", "key": "k", "algorithms": ["HS256"]}, "operator_roles": ["sre"]}
ALICE = Principal(id="alice", roles=("developer",))
OPERATOR = Principal(id="olga", roles=("developer", "sre"))


def operators(**auth: Any) -> Operators:
    return Operators(parse_settings({"auth": auth}).auth)


def test_operators_are_those_with_an_operator_role_and_everyone_in_dev_mode() -> None:
    assert [operators(**JWT).includes(p) for p in (ALICE, OPERATOR)] == [False, True]
    assert operators().includes(ALICE)


class Provider:
    status = ReloadStatus(source="dir", revision="r1", loaded_at="t0", last_attempt_at="t1", last_error="x.rego:3")


def test_only_operators_see_why_a_policy_change_was_refused() -> None:
    view = PolicyStatusView(Provider(), operators(**JWT))
    assert view.status_for(OPERATOR).last_error == "x.rego:3"
    assert view.status_for(ALICE).last_error == REFUSED_WITHOUT_DETAILS
    assert view.status_for(ALICE).revision == "r1"


class Approvals:
    def __init__(self) -> None:
        self.pending_calls: list[tuple[str, bool, int]] = []

    async def approve(self, approver: Principal, preview_id: str, hash_seen: str,
                      comment: str | None) -> ApprovalResult:
        return ApprovalResult(ok=True)

    async def deny(self, approver: Principal, preview_id: str, reason: str) -> ApprovalResult:
        return ApprovalResult(ok=False)

    async def pending(self, principal: Principal, *, all_of_them: bool, limit: int = 100, page_token: str = "",
                      tool: str | None = None, requester: str | None = None) -> PreviewPage:
        self.pending_calls.append((principal.id, all_of_them, limit))
        return PreviewPage()


@pytest.mark.parametrize(("asked", "limit"), [(0, DEFAULT_LIST_LIMIT), (5, 5), (10**6, MAX_LIST_LIMIT)])
async def test_the_desk_lists_all_previews_for_operators_within_the_limits(asked: int, limit: int) -> None:
    approvals = Approvals()
    desk = ApprovalDesk(approvals, operators(**JWT))
    await desk.pending(ALICE, limit=asked)
    await desk.pending(OPERATOR, limit=asked)
    assert approvals.pending_calls == [("alice", False, limit), ("olga", True, limit)]
    assert (await desk.approve(ALICE, "p", "h", None)).ok and not (await desk.deny(ALICE, "p", "no")).ok
