"""The gRPC server: listeners (Unix socket, TCP), health, reflection, graceful shutdown.

``create_server`` builds and binds a server without starting it (tests use it with port 0 or a temporary socket;
binding is ``sidecar.server.listeners``, TLS on TCP ``sidecar.server.tls``, the health-only listener of probes
``sidecar.server.probes``); ``run`` serves the sidecar until SIGTERM/SIGINT and logs at start what it serves with:
plugins, tools, store, policy engine and revision, listeners, trace exporters. What it runs (a ``Serving``) is built
by the composition root, ``sidecar.bootstrap``, whose ``serve`` opens it and runs it here; this package never
imports the root. With a chain key (``audit.chain_key``) it writes the signed audit checkpoint
(``sidecar.state.checkpoint``) at an interval and, once the last calls are recorded, at shutdown. The HTTP endpoints
that are on (``sidecar.server.endpoints``: metrics, MCP, the approval inbox, HTTP/JSON) run on the same event loop:
metrics started first and stopped last, so a scrape sees the whole shutdown; the others started before gRPC and
stopped before it, each within ``server.shutdown_grace_seconds``. As one of ``server.workers`` processes (a
``WorkerRole``, from ``sidecar.server.supervisor``) it shares its TCP ports with the other workers (SO_REUSEPORT),
writes the checkpoint only as worker 0, and says when it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.config import AuthMode, Settings
from sidecar.contract import Principal, ReloadStatus
from sidecar.metrics import Metrics
from sidecar.policy.reload import ReloadingEngine
from sidecar.server import interceptors
from sidecar.server.approval_service import SERVICE_NAME as APPROVAL_SERVICE_NAME
from sidecar.server.approval_service import ApprovalServicer
from sidecar.server.auth import Authenticator
from sidecar.server.endpoints import Phase
from sidecar.server.gateway import ToolGateway
from sidecar.server.listeners import bind_all, remove_sockets
from sidecar.server.policy_service import RELOAD_HEALTH_NAME, PolicyServicer
from sidecar.server.policy_service import SERVICE_NAME as POLICY_SERVICE_NAME
from sidecar.server.probes import open_probes
from sidecar.server.roles import ApprovalDesk, ApprovalGateway, Operators, PolicyStatusView, StatusProvider
from sidecar.server.tls import server_credentials
from sidecar.server.tool_service import SERVICE_NAME, ToolServicer

if TYPE_CHECKING:
    from sidecar.pipeline.gate import Pipeline
    from sidecar.server.serving import Serving

__all__ = ["SERVICE_NAME", "Sidecar", "WorkerRole", "create_server", "run"]

log = logging.getLogger(__name__)

_HEALTH_SERVICES = ("", SERVICE_NAME)


@dataclass(frozen=True)
class WorkerRole:
    """This sidecar is worker ``index`` of several processes serving the same ports (``server.workers``)."""

    index: int
    ready: Callable[[tuple[str, ...]], None]  # told the addresses as bound, once serving

    @property
    def writes_checkpoint(self) -> bool:
        """One worker writes the audit checkpoint (a signed head of the one chain all of them append to)."""
        return self.index == 0


@dataclass(frozen=True)
class Sidecar:
    """A bound, not yet started server and what it needs to start and stop cleanly."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    addresses: tuple[str, ...]
    socket_paths: tuple[Path, ...]
    dev_principal: Principal | None
    probes: grpc.aio.Server | None = None  # server.health_listen: health alone
    probe_addresses: tuple[str, ...] = ()

    async def start(self) -> None:
        """Start serving, restrict the sockets to owner and group, then report SERVING."""
        await self.server.start()
        if self.probes is not None:
            await self.probes.start()
        for path in self.socket_paths:
            path.chmod(0o660)
        for service in _HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.dev_principal is not None:
            log.warning("auth mode 'dev': every caller is trusted as principal %r; never use it in production",
                        self.dev_principal.id)

    async def report_policy(self, status: ReloadStatus) -> None:
        """Health of ``toolbooth.policy``: NOT_SERVING while a policy change is refused."""
        Health = health_pb2.HealthCheckResponse
        await self.health.set(RELOAD_HEALTH_NAME, Health.SERVING if status.healthy else Health.NOT_SERVING)

    async def stop(self, grace: float | None) -> None:
        """Report NOT_SERVING, let in-flight calls finish within ``grace``, remove the sockets."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.probes is not None:  # answered NOT_SERVING until the last call ended
            await self.probes.stop(None)
        remove_sockets(self.socket_paths)


async def create_server(settings: Settings, gateway: ToolGateway, *, policy: StatusProvider | None = None,
                        approvals: ApprovalGateway | None = None,
                        metrics: Metrics | None = None, trace_context: bool = False,
                        reuse_port: bool = False) -> tuple[grpc.aio.Server, Sidecar]:
    """Build the server with every service and bind each ``settings.server.listen`` address.

    With ``policy`` (the reloading engine) the ``PolicyService`` answers status requests; with
    ``approvals`` (the pipeline's) the ``ApprovalService`` serves approvers. Every call of these
    services is authenticated, and its exceptions mapped to statuses, by ``sidecar.server.interceptors``
    (and counted into ``metrics``, when given); with ``trace_context`` (a tracing gateway) its calls continue
    the trace its metadata carries. With ``reuse_port`` (a worker process) its TCP ports, the probes' too, are
    shared with the other workers.
    """
    dev = settings.auth.effective_mode is AuthMode.DEV
    chain = interceptors.chain(Authenticator(settings.auth), metrics=metrics, trace_context=trace_context,
                               access_log=settings.logging.access)
    server = grpc.aio.server(options=_channel_options(settings, reuse_port))
    layered = interceptors.Layered(chain)
    layered.add(server, pb_grpc.add_ToolServiceServicer_to_server, ToolServicer(gateway))
    names = [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME]
    operators = Operators(settings.auth)
    if approvals is not None:
        layered.add(server, pb_grpc.add_ApprovalServiceServicer_to_server,
                    ApprovalServicer(ApprovalDesk(approvals, operators)))
        names.append(APPROVAL_SERVICE_NAME)
    if policy is not None:
        layered.add(server, pb_grpc.add_PolicyServiceServicer_to_server,
                    PolicyServicer(PolicyStatusView(policy, operators)))
        names.append(POLICY_SERVICE_NAME)
    health_servicer = await _add_health(server)
    if settings.server.reflection or (settings.server.reflection is None and dev):
        reflection.enable_server_reflection(names, server)
    addresses, sockets = await bind_all(server, settings.server.listen, tls=server_credentials(settings.server.tls),
                                        reuse_port=reuse_port)
    probes, probe_addresses = await _bind_probes(settings.server.health_listen, health_servicer, server, sockets,
                                                 reuse_port)
    dev_principal = settings.auth.dev_principal if dev else None
    sidecar = Sidecar(server, health_servicer, addresses, sockets, dev_principal, probes, probe_addresses)
    if policy is not None:
        await sidecar.report_policy(policy.status)
    return server, sidecar


async def run(serving: Serving, settings: Settings, *, stop: asyncio.Event | None = None,
              worker: WorkerRole | None = None) -> None:
    """Serve what ``serving`` holds until SIGTERM, SIGINT or ``stop``, then shut down gracefully and close it
    (``sidecar.bootstrap.serve`` opens it); as ``worker``, one of several processes."""
    from sidecar.policy.factory import reload_interval

    reloader, pipeline, endpoints = serving.reloader, serving.pipeline, serving.endpoints
    try:
        async with endpoints.serving(Phase.AROUND_GRPC):
            _, sidecar = await create_server(settings, pipeline, policy=reloader, approvals=pipeline.approvals,
                                             metrics=pipeline.metrics, trace_context=pipeline.tracing.enabled,
                                             reuse_port=worker is not None)
            reloader.on_status = sidecar.report_policy
            try:
                async with endpoints.serving(Phase.WITHIN_GRPC):
                    try:
                        await sidecar.start()
                        _log_start(settings, pipeline, reloader, sidecar)
                        if worker is not None:
                            worker.ready(sidecar.addresses)
                        checkpoints = serving.checkpointer.run if serving.checkpointer else None
                        async with _in_background(reloader.watch, reload_interval(settings.policy)), \
                                _in_background(checkpoints, settings.audit.checkpoint_interval_seconds):
                            await _wait_for_stop(stop or asyncio.Event())
                    finally:  # stopping, as asked or on a failure: no handler runs past the grace
                        pipeline.stop_by(time.monotonic() + settings.server.shutdown_grace_seconds)
            finally:
                await sidecar.stop(settings.server.shutdown_grace_seconds)
    finally:
        await serving.aclose()
    log.info("toolbooth stopped")


def _log_start(settings: Settings, pipeline: Pipeline, reloader: ReloadingEngine, sidecar: Sidecar) -> None:
    """What this sidecar serves with, logged once at start (the store without its password); JSON lines carry
    each as fields too."""
    plugins = [str(plugin) for plugin in pipeline.registry.plugins]
    tools = [defn.name for defn in pipeline.registry]
    log.info("plugins: %s", "; ".join(plugins) if plugins else "none from entry points", extra={"plugins": plugins})
    log.info("tools: %s", ", ".join(tools) or "none", extra={"tools": tools})
    store = settings.store.describe()
    log.info("store: %s", store, extra={"store": store})
    engine, source = settings.policy.engine.value, reloader.status.source
    log.info("policy: engine %s, %s, revision %s", engine, source, reloader.revision,
             extra={"policy_engine": engine, "policy_source": source, "policy_revision": reloader.revision})
    log.info("toolbooth listening on %s with policy revision %s", ", ".join(sidecar.addresses), reloader.revision,
             extra={"listeners": list(sidecar.addresses)})
    if sidecar.probe_addresses:
        log.info("health only (for probes) on %s", ", ".join(sidecar.probe_addresses),
                 extra={"health_listeners": list(sidecar.probe_addresses)})
    exporters = list(pipeline.tracing.exporters)
    log.info("traces: %s", f"exported to {', '.join(exporters)}" if exporters else "off (OTEL_TRACES_EXPORTER)",
             extra={"trace_exporters": exporters})


@contextlib.asynccontextmanager
async def _in_background(work: Callable[[float, asyncio.Event], Coroutine[Any, Any, None]] | None,
                         interval: float) -> AsyncIterator[None]:
    """Run ``work(interval, stop)`` (hot reload, audit checkpoints) while the body runs, then stop it and wait
    for it to end; ``work`` ``None`` or ``interval`` 0: nothing runs."""
    if work is None or interval <= 0:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(work(interval, stop))
    try:
        yield
    finally:
        stop.set()
        await task


def _channel_options(settings: Settings, reuse_port: bool) -> list[tuple[str, int]]:
    # Without so_reuseport=0 a second sidecar could silently share a TCP port; only workers share one.
    # gRPC refuses metadata between its soft and hard limits at random (by default 8 and 16 KiB): one limit for
    # both, so a call's metadata is refused always or never (RESOURCE_EXHAUSTED, naming the sizes).
    metadata = settings.auth.max_metadata_bytes
    return [
        ("grpc.max_send_message_length", settings.limits.max_message_bytes),
        ("grpc.max_receive_message_length", settings.limits.max_message_bytes),
        ("grpc.max_metadata_size", metadata),
        ("grpc.absolute_max_metadata_size", metadata),
        ("grpc.so_reuseport", int(reuse_port)),
    ]


async def _add_health(server: grpc.aio.Server) -> health.aio.HealthServicer:
    """Health starts NOT_SERVING; ``Sidecar.start`` flips it once the server is up."""
    servicer = health.aio.HealthServicer()
    for service in _HEALTH_SERVICES:
        await servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


async def _bind_probes(address: str | None, servicer: health.aio.HealthServicer, server: grpc.aio.Server,
                       sockets: tuple[Path, ...], reuse_port: bool) -> tuple[grpc.aio.Server | None, tuple[str, ...]]:
    """The health-only listener of ``server.health_listen``, if any; when it cannot bind, ``server`` is
    released too."""
    if address is None:
        return None, ()
    try:
        return await open_probes(address, servicer, reuse_port=reuse_port)
    except BaseException:
        await server.stop(None)
        remove_sockets(sockets)
        raise


async def _wait_for_stop(stop: asyncio.Event) -> None:
    """Wait for ``stop``; in the main thread SIGTERM and SIGINT set it too."""
    if threading.current_thread() is not threading.main_thread():
        await stop.wait()
        return
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for number in signals:
        loop.add_signal_handler(number, _on_signal, number, stop)
    try:
        await stop.wait()
    finally:
        for number in signals:
            loop.remove_signal_handler(number)


def _on_signal(number: signal.Signals, stop: asyncio.Event) -> None:
    log.info("received %s, shutting down", number.name)
    stop.set()
