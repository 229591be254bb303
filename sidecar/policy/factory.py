"""Opening the configured policy engine, reloadable and cached: the policy side of the composition root.

Which engine decides, and how it opens, is the row of ``policy.engine`` in ``sidecar.policy.engines``;
here it is put behind hot reload (a directory, a bundle, or nothing to watch when its server manages the
policies) and the decision cache. Closing one is ``await engine.aclose()``, whatever it wraps.
"""

from __future__ import annotations

import functools
from pathlib import Path

from sidecar.config import PolicySettings
from sidecar.errors import PolicyLoadError
from sidecar.policy.bundle.fetch import BundleFetcher
from sidecar.policy.bundle.signing import VerificationConfig
from sidecar.policy.cache import CachingEngine
from sidecar.policy.compiling import compiled
from sidecar.policy.devtools.runner import Outcome, run_tests
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.engines import engine_for
from sidecar.policy.files import checked_files
from sidecar.policy.reload import PolicySource, ReloadingEngine
from sidecar.policy.sources import BundleSource, DirectorySource, FixedSource

__all__ = ["open_reloading", "policy_source", "reload_interval", "with_cache"]


def policy_source(settings: PolicySettings) -> PolicySource:
    """What hot reload watches: ``policy.bundle`` or ``policy.path``, unless the engine's server manages the
    policies."""
    factory = engine_for(settings)
    if (managed := factory.managed(settings)) is not None:
        return FixedSource(managed, lambda: factory.open_managed(settings))
    if settings.bundle is not None:
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


async def open_reloading(settings: PolicySettings) -> ReloadingEngine:
    """The first policy set from ``policy_source``, ready to be watched.

    With ``policy.reload_requires_tests`` every set — the first one too — must pass
    the ``*_test.rego`` tests of ``policy.path`` before it serves.
    """
    return await ReloadingEngine.start(policy_source(settings))


async def _require_passing_tests(root: Path) -> None:
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

