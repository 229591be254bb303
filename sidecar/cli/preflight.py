"""What ``toolbooth serve`` checks before it listens, run without listening (``toolbooth config validate``).

``check_files_named`` is cheap and has no side effects: the files the configuration names exist and are
usable (the JWT key fits one of its algorithms, the TLS certificate, its key and client CA, the mask key
file, the bundle verification keys, the policy directory or bundle file), the extra of each HTTP endpoint
that is on is installed (``sidecar.config.endpoints``: the MCP SDK for ``mcp.listen``, …), so is each span
exporter ``OTEL_TRACES_EXPORTER`` names (``sidecar.telemetry.tracing.check_exporters``), and the HTTP
listeners' caps fit the files this process may open (``sidecar.server.http_guard.check_descriptors``).
``serve`` runs it first, so such a mistake stops it before anything opens.
``preflight`` adds what takes longer, still changing nothing: the plugins load under the allow-list,
each with its ``plugins.config`` section validated against its settings model, ``isolation`` names
loaded sync tools whose handlers import by path (no worker process is started), the
policies load and compile as ``serve`` loads them (a bundle URL is fetched once; an OPA server is not
contacted: the files it would be sent are compiled here) with no meter looking back further than
``store.history_retention_hours``, and the store is reachable (SQLite: the file
opens read-only or its directory is writable; PostgreSQL: one connection and ``SELECT 1``; neither
creates nor migrates anything), and so is its local journal (a SQLite file too, holding no writes of
another store).

Failures are raised as ``serve`` raises them: ``ConfigError`` and ``PolicyLoadError`` mean the
configuration or what it names is wrong (exit 2); ``PluginLoadError``, ``BundleFetchError``,
``StoreUnavailableError`` and ``OSError`` (the listeners' caps past the process's file limit) mean something
it relies on fails (exit 1).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sidecar.cli.common import EXIT_FAILURE, EXIT_USAGE
from sidecar.config import Settings, StoreSettings
from sidecar.errors import (
    BundleFetchError,
    ConfigError,
    PluginLoadError,
    PolicyLoadError,
    StoreUnavailableError,
)
from sidecar.tools.registry import PluginInfo

__all__ = ["STARTUP_FAILURES", "Checked", "check_files_named", "failure_exit", "preflight"]

# What stops ``serve`` (or ``config validate``) before it listens; ``OSError`` also covers a failed bind
# (``sidecar.server.listeners``), ``RuntimeError`` what gRPC raises without a reason.
STARTUP_FAILURES: tuple[type[BaseException], ...] = (
    ConfigError, PluginLoadError, PolicyLoadError, StoreUnavailableError, OSError, RuntimeError)


def failure_exit(exc: BaseException) -> int:
    """2 when the configuration, or a file or policy it names, is wrong; 1 when something it relies on fails."""
    if isinstance(exc, ConfigError | PolicyLoadError) and not isinstance(exc, BundleFetchError):
        return EXIT_USAGE
    return EXIT_FAILURE


@dataclass(frozen=True)
class Checked:
    """What ``serve`` would start with."""

    plugins: tuple[PluginInfo, ...]
    tools: tuple[str, ...]
    isolated: str  # the plugins whose worker processes run which tools
    policy: str  # its source and revision
    store: str  # redacted

    def lines(self) -> list[str]:
        """For people, one line each."""
        return [f"  plugins:  {'; '.join(map(str, self.plugins)) or 'none'}",
                f"  tools:    {', '.join(self.tools) or 'none'}",
                f"  isolated: {self.isolated}",
                f"  policy:   {self.policy}",
                f"  store:    {self.store}, reachable"]


def check_files_named(settings: Settings) -> None:
    """The key files, policy directory and bundle file the settings name exist and are usable, the endpoints' extras
    and the span exporters are installed (else ``ConfigError``); the HTTP listeners' caps fit the file descriptors
    (else ``OSError``)."""
    from sidecar.config.endpoints import check_installed
    from sidecar.policy.engines import engine_for
    from sidecar.server.auth import Authenticator
    from sidecar.server.http_guard import check_descriptors
    from sidecar.server.tls import CertificateFiles
    from sidecar.telemetry.tracing import check_exporters

    Authenticator(settings.auth)  # reads the JWT key and parses it for each allowed algorithm
    if settings.server.tls is not None:
        CertificateFiles(settings.server.tls)  # the certificate and key parse and match, the client CA parses
    check_installed(settings)
    check_exporters()
    check_descriptors(settings)
    settings.audit.read_mask_key()
    settings.audit.read_chain_key()
    policy = settings.policy
    if policy.bundle is not None:
        if policy.bundle.verification is not None:
            from sidecar.policy.bundle.signing import VerificationConfig  # a policy directory needs no bundle code

            VerificationConfig.from_settings(policy.bundle.verification)
        if policy.bundle.file is not None and not policy.bundle.file.is_file():
            raise ConfigError(f"config error at policy.bundle.file: {policy.bundle.file} is not a file")
    elif engine_for(policy).managed(policy) is None:  # the engine decides on policy.path
        if not policy.path.is_dir():
            raise ConfigError(f"config error at policy.path: {policy.path} is not a directory")


async def preflight(settings: Settings) -> Checked:
    """Every check ``serve`` makes before it listens; what it would start with."""
    from sidecar.tools.isolation.plan import isolation_plan
    from sidecar.tools.registry import Registry

    check_files_named(settings)
    registry = await asyncio.to_thread(Registry.for_settings, settings)
    isolated = isolation_plan(registry, settings.isolation)
    policy = await _check_policy(settings)
    await _check_store(settings.store)
    return Checked(registry.plugins, tuple(defn.name for defn in registry), isolated.describe(), policy,
                   settings.store.describe())


async def _check_policy(settings: Settings) -> str:
    """Load the policies as ``serve`` does, but never contact an engine's server (nor upload to it): what it
    would be sent is compiled here."""
    from sidecar.policy.compiling import compiled
    from sidecar.policy.embedded import EmbeddedEngine
    from sidecar.policy.engines import engine_for
    from sidecar.policy.factory import meter_window_check, open_reloading
    from sidecar.policy.files import checked_files

    policy, retention = settings.policy, settings.store.history_retention_hours * 3600
    factory = engine_for(policy)
    if (managed := factory.managed(policy)) is not None:
        return f"{managed} (not contacted)"
    if factory.contacts_server:
        files = await compiled(checked_files, policy.path)
        engine = EmbeddedEngine(files)  # the files the server would be sent, their meters read here
        try:
            await meter_window_check(retention)(engine)
        finally:
            await engine.aclose()
        return f"{factory.label(policy)} (not contacted): directory {policy.path}, revision {files.revision()}"
    reloader = await open_reloading(policy, history_retention_seconds=retention)
    try:
        return f"{factory.label(policy)}: {reloader.status.source}, revision {reloader.revision}"
    finally:
        await reloader.aclose()


async def _check_store(settings: StoreSettings) -> None:
    from sidecar.state.backends import backend_for
    from sidecar.state.journal import Journal
    from sidecar.state.sqlite.reach import reach_file

    await backend_for(settings).reach(settings)
    journal = settings.journal_path()
    await asyncio.to_thread(reach_file, journal, "the local journal")
    await asyncio.to_thread(Journal.check, journal, settings.identity())
