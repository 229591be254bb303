"""Opening the configured policy engine, reloadable and cached: the policy side of the composition root.

Which engine decides, and how it opens, is the row of ``policy.engine`` in ``sidecar.policy.engines``;
here it is put behind hot reload (a directory, a bundle, or nothing to watch when its server manages the
policies) and the decision cache. Closing one is ``await engine.aclose()``, whatever it wraps. Given how long the
store keeps the call history, every set loaded (the first one, each reload) is refused if one of its meters looks
back further (``meter_window_check``).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from sidecar.config import PolicySettings
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy.cache import CachingEngine
from sidecar.policy.compiling import compiled
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.engines import engine_for
from sidecar.policy.files import checked_files
from sidecar.policy.history import check_meter_windows
from sidecar.policy.reload import PolicyCheck, PolicySource, ReloadingEngine
from sidecar.policy.sources import BundleSource, DirectorySource, FixedSource

__all__ = ["meter_window_check", "open_reloading", "policy_source", "reload_interval", "with_cache"]

log = logging.getLogger("toolbooth.policy.reload")


def policy_source(settings: PolicySettings) -> PolicySource:
    """What hot reload watches: ``policy.bundle`` or ``policy.path``, unless the engine's server manages the
    policies."""
    factory = engine_for(settings)
    if (managed := factory.managed(settings)) is not None:
        return FixedSource(managed, lambda: factory.open_managed(settings))
    if settings.bundle is not None:
        from sidecar.policy.bundle.fetch import BundleFetcher  # a policy directory loads nothing of bundles
        from sidecar.policy.bundle.signing import VerificationConfig

        bundle = settings.bundle
        verification = None if bundle.verification is None else VerificationConfig.from_settings(bundle.verification)
        serve = functools.partial(factory.open_files, settings)
        if bundle.file is not None:
            return BundleSource.from_file(bundle.file, verification, serve)
        return BundleSource.from_url(BundleFetcher.from_settings(bundle), verification, serve)
    return DirectorySource(settings.path, lambda: _load_directory(settings))


async def _load_directory(settings: PolicySettings) -> PolicyEngine:
    """Compile ``policy.path`` here (and run its tests when required) before any engine serves it:
    an OPA server only ever receives a set that passed."""
    files = await compiled(checked_files, settings.path)
    if settings.reload_requires_tests:
        await _require_passing_tests(settings.path)
    return await engine_for(settings).open_files(settings, files)


def reload_interval(settings: PolicySettings) -> float:
    """Seconds between looks at the source: a bundle URL's polling period, else the reload interval."""
    if settings.bundle is not None and settings.bundle.url is not None:
        return settings.bundle.polling_seconds
    return settings.reload_interval_seconds


async def open_reloading(settings: PolicySettings, *,
                         history_retention_seconds: float | None = None) -> ReloadingEngine:
    """The first policy set from ``policy_source``, ready to be watched.

    With ``policy.reload_requires_tests`` every set — the first one too — must pass
    the ``*_test.rego`` tests of ``policy.path`` before it serves. With ``history_retention_seconds``
    (``store.history_retention_hours`` in seconds) every set is refused whose meter looks back further.
    """
    check = None if history_retention_seconds is None else meter_window_check(history_retention_seconds)
    return await ReloadingEngine.start(policy_source(settings), check)


def meter_window_check(retention_seconds: float) -> PolicyCheck:
    """A check refusing (``PolicyLoadError``) an engine with a meter looking back further than ``retention_seconds``.

    An engine that cannot say what it meters (an OPA server not answering) is not refused: it is logged, and each
    call checks its meters again (``sidecar.pipeline.stored_history``), failing closed.
    """

    async def check(engine: PolicyEngine) -> None:
        try:
            needs = await engine.history_needs()
        except PolicyEvaluationError as exc:
            log.warning("cannot read the meters of policy revision %s to check their windows (each call will): %s",
                        engine.revision, exc)
            return
        check_meter_windows(needs, retention_seconds)

    return check


async def _require_passing_tests(root: Path) -> None:
    from sidecar.policy.devtools.runner import Outcome, run_tests  # the test runner loads only to run tests

    report = await compiled(run_tests, root)
    if not report.passed:
        failed = [test.rule for test in report.tests if test.outcome is not Outcome.PASS]
        raise PolicyLoadError(f"policy tests under {root} failed: {', '.join(failed) or 'no tests found'}")


def with_cache(engine: PolicyEngine, settings: PolicySettings) -> PolicyEngine:
    """``engine`` behind the decision cache, when ``policy.cache.enabled``."""
    cache = settings.cache
    if not cache.enabled:
        return engine
    return CachingEngine(engine, max_entries=cache.max_entries, ttl_seconds=cache.ttl_seconds)

