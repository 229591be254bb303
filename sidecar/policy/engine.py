"""The policy seam: the ``PolicyEngine`` protocol every engine implements, and ``DelegatingEngine``.

An engine names the policy revision in force (``revision``), says whether its policies may read
``input.call.idempotency_key`` (``reads_idempotency_key``, part of the decision cache's key), answers
decisions (``decide``, ``decide_many``), reads ``data.toolbooth.audit.mask`` (``audit_masks``), says what of a
call's history its policies read (``history_needs``: ``sidecar.policy.history``) and releases what it holds
(``aclose``). Every engine implements all seven, so callers call them directly.
The first two are facts of the policy set: they change only when another set is loaded
(``sidecar.policy.reload``), so a caller may read them once per call.

Failing closed: an engine that cannot evaluate (error, unreachable, too slow) raises
``PolicyEvaluationError`` -> ``SERVICE_UNAVAILABLE``, retryable; a decision of the wrong
shape raises ``MalformedDecisionError`` -> ``INTERNAL_ERROR``, not retryable.

``DelegatingEngine`` is the base of engines that wrap another one (the decision cache, hot
reload, test doubles), in the style of interceptor chains: each of its methods passes the call
on to ``inner``, so a wrapper overrides only what it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Protocol

from sidecar.policy.decision import Decision, Stage
from sidecar.policy.history import HistoryNeeds
from sidecar.policy.input import PolicyInput

__all__ = ["DelegatingEngine", "PolicyEngine"]


class PolicyEngine(Protocol):
    """Evaluates the decisions of one policy set. Implementations must fail closed by raising.

    Its members, all seven: ``revision``, ``reads_idempotency_key``, ``decide``, ``decide_many``,
    ``audit_masks``, ``history_needs``, ``aclose``.
    """

    @property
    def revision(self) -> str:
        """Content hash of the policy set and its data in force."""
        ...

    @property
    def reads_idempotency_key(self) -> bool:
        """Whether a decision may depend on ``input.call.idempotency_key``: the policy set's source (or data)
        mentions ``idempotency_key``, or it is not known (policies an OPA server manages itself)."""
        ...

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """Evaluate one decision."""
        ...

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """Evaluate one decision per input, in order (used by ``ListTools``)."""
        ...

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        """The JSON pointers the policy masks in each tool's audited arguments
        (``data.toolbooth.audit.mask``, checked); raises like a decision."""
        ...

    async def history_needs(self) -> HistoryNeeds:
        """What of a call's history the policies read: the meters ``data.toolbooth.history`` declares (checked),
        and whether they read the conversation's labels or the call's failures; raises like a decision."""
        ...

    async def aclose(self) -> None:
        """Release what the engine holds (an HTTP session, a compiled engine); nothing for some."""
        ...


class DelegatingEngine:
    """A ``PolicyEngine`` passing every call on to ``inner``; subclasses override what they change.

    ``inner`` is a plain attribute, so a wrapper may replace the engine it passes calls to
    (hot reload swaps in a new policy set that way).
    """

    def __init__(self, inner: PolicyEngine) -> None:
        self.inner = inner

    # Read through every wrapper on every call: C-level getters, no Python frame per wrapper.
    revision: property = property(attrgetter("inner.revision"), doc="The wrapped engine's revision.")
    reads_idempotency_key: property = property(attrgetter("inner.reads_idempotency_key"),
                                               doc="The wrapped engine's answer.")

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """The wrapped engine's decision."""
        return await self.inner.decide(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """The wrapped engine's decisions, in order."""
        return await self.inner.decide_many(stage, inputs)

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        """The wrapped engine's audit masks."""
        return await self.inner.audit_masks()

    async def history_needs(self) -> HistoryNeeds:
        """The wrapped engine's history needs."""
        return await self.inner.history_needs()

    async def aclose(self) -> None:
        """Release the wrapped engine."""
        await self.inner.aclose()
