"""Policy decisions: the ``PolicyEngine`` protocol and the decision documents it returns.

Three questions, three Rego packages, each answering with a decision document
(not a bare boolean) at the rule ``decision``:

* ``data.toolbooth.availability.decision`` -> ``{"allow": bool, "reason"?: str}``
* ``data.toolbooth.authz.decision`` -> ``{"allow": bool, "code"?: str, "reason"?: str}``
  (``code``: ``PERMISSION_DENIED`` or ``RESOURCE_NOT_FOUND``)
* ``data.toolbooth.approval.decision`` -> ``{"required": bool, "reason"?: str}``

Any evaluation failure raises ``PolicyEvaluationError``; the pipeline then denies
(fails closed) with ``SERVICE_UNAVAILABLE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.contract import ErrorCode

if TYPE_CHECKING:
    from sidecar.policy.input import PolicyInput


class Stage(StrEnum):
    """Which question a decision answers; also the Rego package name under ``toolbooth``."""

    AVAILABILITY = "availability"
    AUTHZ = "authz"
    APPROVAL = "approval"


@dataclass(frozen=True, slots=True)
class Decision:
    """A well-typed decision document. ``allow`` answers availability/authz, ``required`` approval."""

    allow: bool = False
    required: bool = False
    code: ErrorCode | None = None
    reason: str = ""

    def document(self) -> dict[str, Any]:
        """The decision as JSON data for the audit log (defaults left out)."""
        fields = {"allow": self.allow, "required": self.required, "code": self.code, "reason": self.reason}
        return {name: value for name, value in fields.items() if value}


class PolicyEvaluationError(Exception):
    """A policy could not be evaluated (compile or runtime error, malformed decision)."""


class PolicyLoadError(ValueError):
    """The policy source cannot be loaded; the message names the file."""


class PolicyEngine(Protocol):
    """Evaluates the three decisions. Implementations must fail closed by raising."""

    @property
    def revision(self) -> str:
        """Content hash of the policy set and its data in force."""
        ...

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """Evaluate one decision."""
        ...

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """Evaluate one decision per input, in order (used by ``ListTools``)."""
        ...
