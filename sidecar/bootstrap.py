"""The composition root: the one place that builds the sidecar's collaborators and wires them together.

``open_sidecar`` opens what ``toolbooth serve`` runs: the reloadable policy engine (watched for
changes, asked for its status) and the pipeline over it, cached. ``open_pipeline`` loads plugins
and policies and opens the store from ``Settings``; ``assemble``
wires given parts (tests and tools pass their own). The order of a call's stages is written here
once: ``decision_stages`` (resolve, validate, authorize, approval) are the stages that decide, and
a real call runs them between audit and idempotency + dispatch; ``toolbooth policy eval`` runs the
same objects with nothing after them (``dry_run_chain``). Nothing else constructs collaborators.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sidecar.config import Limits, Settings
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.chain import CallStage, Chain
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.gate import Pipeline
from sidecar.pipeline.stages.approval import ApprovalStage
from sidecar.pipeline.stages.audit import Auditor, AuditStage
from sidecar.pipeline.stages.authorize import AuthorizeStage
from sidecar.pipeline.stages.dispatch import DispatchStage
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.resolve import ResolveStage
from sidecar.pipeline.stages.validate import ValidateStage
from sidecar.policy import PolicyEngine, close_engine
from sidecar.policy.factory import open_reloading, with_cache
from sidecar.policy.reload import ReloadingEngine
from sidecar.state import Store
from sidecar.state.factory import open_store
from sidecar.state.idempotency import Expiry
from sidecar.tools.dispatch import Dispatcher
from sidecar.tools.masking import Masker
from sidecar.tools.registry import Registry

__all__ = ["assemble", "decision_stages", "dry_run_chain", "open_pipeline", "open_sidecar"]


async def open_sidecar(settings: Settings, *, registry: Registry | None = None) -> tuple[ReloadingEngine, Pipeline]:
    """The reloading policy engine and the pipeline deciding with it (through the decision cache)."""
    reloader = await open_reloading(settings.policy)
    try:
        return reloader, await open_pipeline(settings, registry=registry, policy=with_cache(reloader, settings.policy))
    except BaseException:
        await close_engine(reloader)
        raise


async def open_pipeline(settings: Settings, *, registry: Registry | None = None,
                        policy: PolicyEngine | None = None) -> Pipeline:
    """Load plugins (unless ``registry`` is given) and policies (unless ``policy`` is), open the store."""
    if registry is None:
        registry = Registry.from_entry_points(allow=settings.plugins.allow)
    engine = policy or with_cache(await open_reloading(settings.policy), settings.policy)
    try:
        store = await open_store(settings.store)
    except BaseException:
        await close_engine(engine)
        raise
    try:
        mask_key = settings.audit.read_mask_key() or await store.audit_mask_key(secrets.token_bytes(32))
    except BaseException:
        await store.aclose()
        await close_engine(engine)
        raise
    return assemble(registry=registry, policy=engine, store=store, limits=settings.limits, mask_key=mask_key,
                    retention_hours=settings.store.idempotency_retention_hours)


def assemble(*, registry: Registry, policy: PolicyEngine, store: Store, limits: Limits,
             mask_key: bytes | None = None, retention_hours: float = 24.0) -> Pipeline:
    """The pipeline over these parts. ``mask_key`` masks sensitive values in the audit log and previews
    (default: a random key of this pipeline); finished idempotency records older than ``retention_hours``
    are deleted."""
    decider, masker = Decider(policy), Masker(mask_key or secrets.token_bytes(32))
    approvals, auditor = Approvals(store, policy), Auditor(store, masker)
    dispatcher = Dispatcher(sync_threads=limits.sync_handler_threads)
    expiry = Expiry(store, retention_hours * 3600)
    resolve, idempotency = ResolveStage(registry, decider), IdempotencyStage(store, auditor, expiry)
    chain = Chain([AuditStage(auditor), *decision_stages(resolve, decider, limits, approvals, masker), idempotency,
                   DispatchStage(dispatcher, limits)])
    return Pipeline(registry=registry, policy=policy, store=store, limits=limits, approvals=approvals, chain=chain,
                    resolve=resolve, idempotency=idempotency, dispatcher=dispatcher, expiry=expiry)


def decision_stages(resolve: ResolveStage, decider: Decider, limits: Limits, approvals: Approvals | None,
                    masker: Masker) -> Sequence[CallStage]:
    """The stages that decide whether a call may run, in order (DESIGN.md, stages 2-5)."""
    return [resolve, ValidateStage(limits, decider), AuthorizeStage(decider), ApprovalStage(decider, approvals, masker)]


def dry_run_chain(registry: Registry, policy: PolicyEngine, limits: Limits, end: CallStage) -> Chain:
    """The deciding stages of a real call over ``policy``, then ``end`` where the call would run.
    No preview is opened and nothing is stored or executed."""
    decider = Decider(policy)
    masker = Masker(secrets.token_bytes(32))  # no preview is opened, so nothing is ever masked with it
    return Chain([*decision_stages(ResolveStage(registry, decider), decider, limits, None, masker), end])
