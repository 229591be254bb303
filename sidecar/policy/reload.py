"""Hot reload: serve one policy revision while watching the source for the next.

``ReloadingEngine`` is a ``PolicyEngine`` that delegates to the engine in force.
``watch`` polls the source's fingerprint; when it changes, the new policy set is
loaded — compiled and, if required, tested — and only then swapped in. A set that
fails to load is refused: the old revision
keeps serving, the refusal is logged, and ``status`` reports it until a later
change loads. The swap happens on the event-loop thread, between two decisions.
Any check of a new set (compiling it, running its tests) belongs to the source's
``load``, so nothing is handed to an engine before it passed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from sidecar.contract import ReloadStatus
from sidecar.errors import PolicyLoadError
from sidecar.metrics import Metrics
from sidecar.policy.engine import DelegatingEngine, PolicyEngine

__all__ = ["PolicySource", "ReloadingEngine"]

log = logging.getLogger("toolbooth.policy.reload")


class PolicySource(Protocol):
    """Where policies come from: a directory, a bundle file or a bundle URL."""

    @property
    def description(self) -> str:
        """What the source is, for logs and the policy status (``directory /etc/policies``)."""
        ...

    async def fingerprint(self) -> str:
        """Changes whenever the content may have changed (cheap: no compilation)."""
        ...

    async def load(self) -> PolicyEngine:
        """Compile the current content; ``PolicyLoadError`` naming the file when it cannot."""
        ...


class ReloadingEngine(DelegatingEngine):
    """A ``PolicyEngine`` whose policy set can be replaced while it serves.

    Decisions, the revision and the audit masks come from ``inner``, the engine in force.
    """

    def __init__(self, source: PolicySource, engine: PolicyEngine, fingerprint: str) -> None:
        super().__init__(engine)
        self._source, self._seen = source, fingerprint
        self.status = ReloadStatus(source.description, engine.revision, _now())
        self.on_status: Callable[[ReloadStatus], Awaitable[None]] | None = None
        self.metrics: Metrics | None = None  # counts each changed set: loaded, refused, or error (unreadable)

    @classmethod
    async def start(cls, source: PolicySource) -> ReloadingEngine:
        """Load the first policy set; failing here stops start-up."""
        fingerprint = await source.fingerprint()
        return cls(source, await source.load(), fingerprint)

    async def reload_if_changed(self) -> ReloadStatus:
        """Look at the source once; load and swap in a changed policy set."""
        fingerprint = await self._source.fingerprint()
        if fingerprint == self._seen:
            return self.status
        self._seen = fingerprint  # a refused set is not retried until it changes again
        try:
            engine = await self._source.load()
        except PolicyLoadError as exc:
            log.error("policy reload refused, revision %s keeps serving: %s", self.revision, exc)
            self._count("refused")
            await self._set(replace(self.status, last_attempt_at=_now(), last_error=str(exc)))
            return self.status
        old, self.inner = self.inner, engine
        await old.aclose()
        log.info("policy revision %s loaded from %s", engine.revision, self._source.description)
        self._count("loaded")
        now = _now()
        await self._set(ReloadStatus(self._source.description, engine.revision, now, now))
        return self.status

    async def watch(self, interval: float, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set; errors reading the source are logged, never fatal."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                try:
                    await self.reload_if_changed()
                except (OSError, PolicyLoadError) as exc:  # e.g. a bundle server that is down
                    log.error("cannot read policy source %s: %s", self._source.description, exc)
                    self._count("error")

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.reloaded(result)

    async def _set(self, status: ReloadStatus) -> None:
        self.status = status
        if self.on_status is not None:
            await self.on_status(status)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
