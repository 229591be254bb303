"""The order of a call's stages, written once, and the one numbering of them that every module and doc uses.

A real call (``call_chain``) meets, outermost first:

0. observers, which see every call and its result: the call's span when the sidecar traces (``TraceStage``),
   its log context when its lines carry call fields (``LogContextStage``), its metrics with ``metrics.listen``
   (``MetricsStage``), then the ``Stages.observers`` given; the first three are in the chain only when on;
1. audit (``AuditStage``): the outcome event of every call that is not detached;
2. request (``RequestStage``): the request's string fields;
   then ``Stages.before_decisions``;
3. resolve + availability (``ResolveStage``);
4. validate (``ValidateStage``);
5. history (``HistoryStage``): what of its history the call's policies read, and what the call adds to it;
6. authorize (``AuthorizeStage``);
7. approval (``ApprovalStage``): checks an approval, or opens a preview;
   then ``Stages.after_decisions``;
8. idempotency (``IdempotencyStage``): claims a write's key; the stages after it run detached;
9. consume approval (``ConsumeApprovalStage``): spends the checked approval, once the call owns its key (a call
   whose key is in progress, reused for another request or replayed must not spend it, ``docs/approvals.md``);
   then ``Stages.before_dispatch``;
10. dispatch (``DispatchStage``): runs the handler and ends the call with its result.

``DecidingStages`` are stages 3-7, those that decide whether a call may run; ``toolbooth policy eval``
(``sidecar.pipeline.dry_run``) runs them alone, with no approvals service and a given history (``GivenHistory``),
so that no preview is opened and nothing is stored or executed. ``Stages`` are what the caller of
``sidecar.bootstrap.assemble`` adds, by slot; ``CallStage`` (``sidecar.pipeline.chain``) says what a stage in
each slot may rely on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from opentelemetry.trace import Tracer

from sidecar.config import Limits
from sidecar.metrics import Metrics
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.chain import CallStage, Chain
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.history import GivenHistory, HistorySource
from sidecar.pipeline.stages.approval import ApprovalStage
from sidecar.pipeline.stages.audit import Auditor, AuditStage
from sidecar.pipeline.stages.authorize import AuthorizeStage
from sidecar.pipeline.stages.consume_approval import ConsumeApprovalStage
from sidecar.pipeline.stages.dispatch import DispatchStage
from sidecar.pipeline.stages.history import HistoryStage
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.log_context import LogContextStage
from sidecar.pipeline.stages.request import RequestStage
from sidecar.pipeline.stages.resolve import ResolveStage
from sidecar.pipeline.stages.trace import TraceStage
from sidecar.pipeline.stages.validate import ValidateStage
from sidecar.tools.masking import Masker
from sidecar.tools.registry import Registry

__all__ = ["DecidingStages", "Stages", "call_chain"]


@dataclass(frozen=True, slots=True)
class DecidingStages:
    """Stages 3-7, in order when iterated."""

    resolve: ResolveStage
    validate: ValidateStage
    history: HistoryStage
    authorize: AuthorizeStage
    approval: ApprovalStage

    @classmethod
    def build(cls, registry: Registry, decider: Decider, limits: Limits, approvals: Approvals | None = None,
              masker: Masker | None = None, history: HistorySource | None = None,
              metrics: Metrics | None = None) -> DecidingStages:
        """The deciding stages over ``registry``; without ``approvals`` no preview is ever opened; without a
        ``history`` source, calls have none (``GivenHistory()``); with ``metrics``, calls their history stopped
        are counted."""
        return cls(ResolveStage(registry, decider), ValidateStage(limits, decider),
                   HistoryStage(decider, history or GivenHistory(), metrics), AuthorizeStage(decider),
                   ApprovalStage(decider, approvals, masker))

    def __iter__(self) -> Iterator[CallStage]:
        return iter((self.resolve, self.validate, self.history, self.authorize, self.approval))


@dataclass(frozen=True, slots=True)
class Stages:
    """Stages added to a real call's chain, by slot, each slot's in the order given (``CallStage`` says which
    calls reach each slot): ``observers`` see every call and its result (stage 0, around audit);
    ``before_decisions`` every call with well-formed fields (after stage 2); ``after_decisions`` only the calls
    the policies let run, approved where they must be (after stage 7); ``before_dispatch`` only the calls
    about to run, a write's once it owns its key and spent its approval (after stage 9)."""

    observers: Sequence[CallStage] = ()
    before_decisions: Sequence[CallStage] = ()
    after_decisions: Sequence[CallStage] = ()
    before_dispatch: Sequence[CallStage] = ()

    def observed_first_by(self, observer: CallStage) -> Stages:
        """These stages with ``observer`` first among the observers."""
        return replace(self, observers=(observer, *self.observers))


def call_chain(auditor: Auditor, deciding: DecidingStages, idempotency: IdempotencyStage,
               consume: ConsumeApprovalStage, dispatch: DispatchStage, *, added: Stages = Stages(),
               tracer: Tracer | None = None, log_context: bool = False) -> Chain:
    """The chain of a real call, stages 0-10: its span (with a ``tracer``), its log context (``log_context``),
    the ``added`` observers (metrics first, when the sidecar counts), audit, the request's fields, the deciding
    stages, idempotency, consuming the approval, dispatch; the ``added`` stages in their slots."""
    observing: list[CallStage] = [TraceStage(tracer)] if tracer is not None else []
    if log_context:
        observing.append(LogContextStage())
    return Chain([*observing, *added.observers, AuditStage(auditor), RequestStage(), *added.before_decisions,
                  *deciding, *added.after_decisions, idempotency, consume, *added.before_dispatch, dispatch])
