"""The order of a call's stages, written once.

``DecidingStages`` are the stages that decide whether a call may run (DESIGN.md, stages 2-5:
resolve + availability, validate, authorize, approval). A real call (``call_chain``) meets them
after audit, which sees every result, and the check of the request's string fields (``RequestStage``),
and before idempotency + dispatch, which run it; ``toolbooth policy eval`` (``sidecar.pipeline.dry_run``)
runs them alone, with no approvals service, so that no preview is opened and nothing is stored or executed.

Around them all, outermost: the call's span when the sidecar traces (``TraceStage``), then its log context
when its lines carry call fields (``LogContextStage``); neither is in the chain otherwise, so they cost
nothing then.

The approval stage only checks an approval; it is consumed between idempotency and dispatch
(``ConsumeApprovalStage``), once the call owns its key: a call whose key is in progress, reused
for another request or replayed must not spend the approval (``docs/approvals.md``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from sidecar.config import Limits
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.chain import CallStage, Chain
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.stages.approval import ApprovalStage
from sidecar.pipeline.stages.audit import Auditor, AuditStage
from sidecar.pipeline.stages.authorize import AuthorizeStage
from sidecar.pipeline.stages.dispatch import DispatchStage
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.log_context import LogContextStage
from sidecar.pipeline.stages.request import RequestStage
from sidecar.pipeline.stages.resolve import ResolveStage
from sidecar.pipeline.stages.trace import TraceStage
from sidecar.pipeline.stages.validate import ValidateStage
from sidecar.tools.masking import Masker
from sidecar.tools.registry import Registry

__all__ = ["DecidingStages", "call_chain"]


@dataclass(frozen=True, slots=True)
class DecidingStages:
    """Stages 2-5, in order when iterated."""

    resolve: ResolveStage
    validate: ValidateStage
    authorize: AuthorizeStage
    approval: ApprovalStage

    @classmethod
    def build(cls, registry: Registry, decider: Decider, limits: Limits, approvals: Approvals | None = None,
              masker: Masker | None = None) -> DecidingStages:
        """The deciding stages over ``registry``; without ``approvals`` no preview is ever opened."""
        return cls(ResolveStage(registry, decider), ValidateStage(limits, decider), AuthorizeStage(decider),
                   ApprovalStage(decider, approvals, masker))

    def __iter__(self) -> Iterator[CallStage]:
        return iter((self.resolve, self.validate, self.authorize, self.approval))


def call_chain(auditor: Auditor, deciding: DecidingStages, idempotency: IdempotencyStage,
               dispatch: DispatchStage, *, observers: Sequence[CallStage] = (), tracer: Tracer | None = None,
               log_context: bool = False) -> Chain:
    """The chain of a real call: its span (with a ``tracer``), its log context (``log_context``), the
    ``observers`` (metrics), which see every call and its result, audit, the request's fields, the deciding
    stages, idempotency, consuming the approval, dispatch."""
    observing: list[CallStage] = [TraceStage(tracer)] if tracer is not None else []
    if log_context:
        observing.append(LogContextStage())
    return Chain([*observing, *observers, AuditStage(auditor), RequestStage(), *deciding, idempotency,
                  deciding.approval.consuming(), dispatch])
