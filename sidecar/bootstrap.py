"""The composition root: the one place that builds the sidecar's collaborators and wires them together.

``serve`` runs the sidecar (``sidecar.server.app.run``) over what ``open_serving`` opens: ``open_sidecar``'s
reloadable policy engine (watched for changes, asked for its status) and the pipeline over it, cached; the HTTP
endpoints that are on (``sidecar.server.endpoints``) over that pipeline; the writer of the signed audit checkpoint.
``open_pipeline`` loads plugins and policies, opens the store from ``Settings`` (its audit chain keyed with
``audit.chain_key``) and starts the worker processes of the isolated tools (``isolation``); ``assemble`` wires given
parts (tests and tools pass their own) into the chain of ``sidecar.pipeline.order``. With ``metrics.listen``, one
``Metrics`` (its own registry) is made here and given to every part that counts: the calls' stage, the engine the
pipeline decides with, approvals, hot reload and the store; with metrics off none of them is put in place. Each
pipeline has its own tracing (``sidecar.telemetry.tracing``): from the ``OTEL_*`` variables unless one is given (a
test's in-memory exporter), closed, its spans flushed, with the pipeline. Nothing else wires a serving sidecar's
collaborators (engine, store, approvals, dispatcher and its worker pools, masker); the dev tools open an engine or a
store alone through the same tables (``sidecar.policy.engines``, ``sidecar.state.backends``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.config import IsolationSettings, Limits, LogFormat, Settings
from sidecar.metrics import Metrics
from sidecar.pipeline.approvals import Approvals
from sidecar.pipeline.decisions import Decider
from sidecar.pipeline.gate import Pipeline
from sidecar.pipeline.order import DecidingStages, Stages, call_chain
from sidecar.pipeline.stages.audit import Auditor
from sidecar.pipeline.stages.consume_approval import ConsumeApprovalStage
from sidecar.pipeline.stages.dispatch import DispatchStage
from sidecar.pipeline.stages.idempotency import IdempotencyStage
from sidecar.pipeline.stages.metrics import MetricsStage
from sidecar.pipeline.stored_history import StoreHistory
from sidecar.policy import PolicyEngine
from sidecar.policy.factory import open_reloading, with_cache
from sidecar.policy.metered import MeteredEngine
from sidecar.policy.reload import ReloadingEngine
from sidecar.server.endpoints import Endpoints, Parts
from sidecar.server.serving import Serving
from sidecar.state import Expiry, Store
from sidecar.state.checkpoint import Checkpointer
from sidecar.state.factory import open_store
from sidecar.telemetry.tracing import Tracing
from sidecar.tools.dispatch import Dispatcher
from sidecar.tools.isolation.plan import isolation_plan
from sidecar.tools.isolation.pool import ProcessPools
from sidecar.tools.masking import Masker
from sidecar.tools.registry import Registry

if TYPE_CHECKING:
    from sidecar.server.app import WorkerRole

__all__ = ["Serving", "assemble", "open_pipeline", "open_serving", "open_sidecar", "serve"]

log = logging.getLogger(__name__)


async def open_sidecar(settings: Settings, *, registry: Registry | None = None, tracing: Tracing | None = None,
                       stages: Stages | None = None) -> tuple[ReloadingEngine, Pipeline]:
    """The reloading policy engine and the pipeline deciding with it (through the decision cache), with ``stages``
    added to its chain; with ``metrics.listen``, both counting into the pipeline's ``metrics``."""
    reloader = await _open_policies(settings)
    reloader.metrics = metrics = Metrics() if settings.metrics.listen is not None else None
    try:
        return reloader, await open_pipeline(settings, registry=registry, policy=with_cache(reloader, settings.policy),
                                             metrics=metrics, tracing=tracing, stages=stages)
    except BaseException:
        await reloader.aclose()
        raise


async def open_pipeline(settings: Settings, *, registry: Registry | None = None,
                        policy: PolicyEngine | None = None, metrics: Metrics | None = None,
                        tracing: Tracing | None = None, stages: Stages | None = None) -> Pipeline:
    """Load plugins (unless ``registry`` is given) and policies (unless ``policy`` is), open the store, start
    the isolated tools' worker processes; count into ``metrics`` (none: a new one with ``metrics.listen``);
    trace as the ``OTEL_*`` variables say unless ``tracing`` is given; add ``stages`` to the chain
    (``assemble``)."""
    if metrics is None and settings.metrics.listen is not None:
        metrics = Metrics()
    if registry is None:
        registry = Registry.for_settings(settings)
    tracing = Tracing.from_env() if tracing is None else tracing
    try:
        engine = policy or with_cache(await _open_policies(settings), settings.policy)
    except BaseException:
        await tracing.aclose()
        raise
    try:
        store = await open_store(settings.store, metrics=metrics)
    except BaseException:
        await engine.aclose()
        await tracing.aclose()
        raise
    try:
        mask_key = settings.audit.read_mask_key() or await store.audit_mask_key(secrets.token_bytes(32))
        store.use_chain_key(settings.audit.read_chain_key())  # HMAC-keyed links; unkeyed SHA-256 without one
        pipeline = assemble(registry=registry, policy=engine, store=store, limits=settings.limits,
                            mask_key=mask_key, retention_hours=settings.store.idempotency_retention_hours,
                            history_retention_hours=settings.store.history_retention_hours,
                            isolation=settings.isolation, metrics=metrics, tracing=tracing,
                            log_context=settings.logging.format is LogFormat.JSON, stages=stages)
    except BaseException:
        await store.aclose()
        await engine.aclose()
        await tracing.aclose()
        raise
    try:
        await pipeline.dispatcher.start()
    except BaseException:
        await pipeline.aclose()
        raise
    return pipeline


async def _open_policies(settings: Settings) -> ReloadingEngine:
    """The reloading policy engine; a set with a meter looking back further than the history is kept is refused."""
    return await open_reloading(settings.policy,
                                history_retention_seconds=settings.store.history_retention_hours * 3600)


def assemble(*, registry: Registry, policy: PolicyEngine, store: Store, limits: Limits,
             mask_key: bytes | None = None, retention_hours: float = 24.0, history_retention_hours: float = 168.0,
             isolation: IsolationSettings | None = None, metrics: Metrics | None = None,
             tracing: Tracing | None = None, log_context: bool = False, stages: Stages | None = None,
             clock: Callable[[], float] = time.time) -> Pipeline:
    """The pipeline over these parts. ``mask_key`` masks sensitive values in the audit log and previews
    (default: a random key of this pipeline); finished idempotency records older than ``retention_hours``
    are deleted, and the call history (``sidecar.pipeline.stored_history``) older than
    ``history_retention_hours``; the tools ``isolation`` names run in worker processes (``ConfigError`` if it
    names a tool that cannot), started by ``open_pipeline`` or else at their first call. With ``metrics``, its calls,
    decisions and approvals are counted there. Calls are traced with ``tracing`` (default: not at all); with
    ``log_context`` their log lines carry their fields (JSON logs). ``stages`` are added to the chain in their
    slots (``sidecar.pipeline.order.Stages``; what each slot may rely on: ``sidecar.pipeline.chain.CallStage``),
    and closed with the pipeline if they have an ``aclose``. Previews expire and finished idempotency records age by
    ``clock`` (epoch seconds; tests move it on)."""
    if metrics is not None:
        policy = MeteredEngine(policy, metrics)
    tracing = Tracing() if tracing is None else tracing
    decider, masker = Decider(policy), Masker(mask_key or secrets.token_bytes(32))
    approvals = Approvals(store, policy, metrics, max_pending=limits.max_pending_previews_per_principal, clock=clock)
    auditor = Auditor(store, masker)
    isolation = isolation or IsolationSettings()
    pools = ProcessPools(isolation_plan(registry, isolation), isolation)
    dispatcher = Dispatcher(sync_threads=limits.sync_handler_threads, pools=pools)
    history = StoreHistory(store, retention_seconds=history_retention_hours * 3600)
    deciding = DecidingStages.build(registry, decider, limits, approvals, masker, history, metrics)
    expiry = Expiry(lambda before: store.expire_operations(before), retention_hours * 3600,  # asked when it runs
                    what="idempotency record", aged="completed", clock=clock)
    idempotency = IdempotencyStage(store, auditor, expiry)
    added = stages or Stages()
    if metrics is not None:
        added = added.observed_first_by(MetricsStage(metrics))
    chain = call_chain(auditor, deciding, idempotency, ConsumeApprovalStage(approvals),
                       DispatchStage(dispatcher, limits), added=added, tracer=tracing.tracer, log_context=log_context)
    return Pipeline(registry=registry, policy=policy, store=store, limits=limits, approvals=approvals, chain=chain,
                    resolve=deciding.resolve, idempotency=idempotency, dispatcher=dispatcher, auditor=auditor,
                    tracing=tracing, metrics=metrics)


async def serve(settings: Settings, *, registry: Registry | None = None, stop: asyncio.Event | None = None,
                worker: WorkerRole | None = None, stages: Stages | None = None) -> None:
    """Run the sidecar, with ``stages`` added to its chain, until SIGTERM, SIGINT or ``stop``, then shut down
    gracefully; as ``worker``, one of several processes (``server.workers``)."""
    from sidecar.server.app import run  # gRPC's server, only to serve

    writes_checkpoint = worker is None or worker.writes_checkpoint
    serving = await open_serving(settings, registry=registry, writes_checkpoint=writes_checkpoint,
                                 reuse_port=worker is not None, stages=stages)
    await run(serving, settings, stop=stop, worker=worker)


async def open_serving(settings: Settings, *, registry: Registry | None = None, writes_checkpoint: bool = True,
                       reuse_port: bool = False, stages: Stages | None = None) -> Serving:
    """``open_sidecar`` and what serves over it: the endpoints (with ``reuse_port``, one of several workers'), and
    the checkpoint's writer when ``writes_checkpoint`` and a chain key is configured."""
    reloader, pipeline = await open_sidecar(settings, registry=registry, stages=stages)
    try:
        checkpointer = _checkpointer(settings, pipeline.store) if writes_checkpoint else None
    except BaseException:
        await pipeline.aclose()
        raise
    parts = Parts(settings, pipeline, pipeline.approvals, pipeline.metrics, reuse_port=reuse_port)
    return Serving(reloader, pipeline, Endpoints(parts), checkpointer)


def _checkpointer(settings: Settings, store: Store) -> Checkpointer | None:
    """The writer of the signed audit checkpoint; ``None`` (said in the log) without a chain key."""
    key = settings.audit.read_chain_key()
    if key is None:
        log.warning("audit chain unkeyed: no audit.chain_key is configured, so whoever can write the database can "
                    "recompute the chain, and no checkpoint is written")
        return None
    path = settings.audit.checkpoint_path(settings.store)
    log.info("audit chain keyed; checkpoint %s", path)
    return Checkpointer(store, key, path)
