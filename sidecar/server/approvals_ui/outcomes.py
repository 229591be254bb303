"""What became of an approval's call, read from the audit log: whether the agent's retry ran and how it ended.

``CallRuns.of`` groups the audited steps of the calls sent with one approval (``ApprovalDesk.calls_with``)
by request: a write that ran was audited ``dispatching`` before its handler started and again with its
outcome; a call refused before it ran (the approval denied, already used, the call not the approved one)
only with its refusal. The call that ran is the first request that was dispatched or succeeded; the others
are attempts, told apart by their status and error code.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.state import AuditRecord

__all__ = ["Attempt", "CallRuns"]

DISPATCHING = "dispatching"
_RAN = ("success", "partial_success")
_STATUS = {"success": "succeeded", "partial_success": "partly succeeded", "error": "failed",
           "cancelled": "its caller went away", DISPATCHING: "started; no outcome recorded yet"}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One call sent with the approval: when, its last audited status and error code, whether it was dispatched."""

    request_id: str
    at: dt.datetime
    status: str
    error_code: str | None
    dispatched: bool

    @property
    def ran(self) -> bool:
        return self.dispatched or self.status in _RAN

    @property
    def text(self) -> str:
        """Its outcome, for people: ``succeeded``, ``failed (TOOL_ERROR)``, ``refused (PERMISSION_DENIED)``..."""
        said = _STATUS.get(self.status, self.status) if self.ran else "refused"
        return f"{said} ({self.error_code})" if self.error_code else said


@dataclass(frozen=True, slots=True)
class CallRuns:
    """The calls sent with one approval, oldest first."""

    attempts: tuple[Attempt, ...] = ()

    @classmethod
    def of(cls, records: Iterable[AuditRecord]) -> CallRuns:
        """The attempts of an approval's audited steps (oldest first)."""
        steps: dict[str, list[AuditRecord]] = {}
        for record in records:
            steps.setdefault(record.event.request_id, []).append(record)
        attempts = []
        for request_id, of_request in steps.items():
            last = of_request[-1].event
            attempts.append(Attempt(request_id, _time(of_request[0].event.time), last.status, last.error_code,
                                    dispatched=any(r.event.status == DISPATCHING for r in of_request)))
        return cls(tuple(attempts))

    @property
    def ran(self) -> Attempt | None:
        """The call that ran, if one did."""
        return next((a for a in self.attempts if a.ran), None)

    @property
    def refused(self) -> tuple[Attempt, ...]:
        """The calls refused before they ran."""
        return tuple(a for a in self.attempts if not a.ran)


def _time(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
