"""Hot reload: serve one policy revision while watching the source for the next.

``ReloadingEngine`` is a ``PolicyEngine`` that delegates to the policy set in force,
published as one immutable ``Loaded`` (the engine, its revision and whether its policies
read the idempotency key: the facts that change only on a reload, read once then).
``watch`` polls the source's fingerprint; when it changes, the new policy set is
loaded — compiled and, if required, tested — and only then swapped in, one assignment
on the event-loop thread. A set that fails to load is refused: the old revision
keeps serving, the refusal is logged, and ``status`` reports it until a later
change loads. The checks of a set's files (compiling them, running its tests) belong to the
source's ``load``, so nothing is handed to an engine before it passed; a ``PolicyCheck`` then checks the
engine loaded (its meters against how long the history is kept: ``sidecar.policy.factory``), at start and at
each reload, before the swap. An engine refused by either is closed, never served.

A call sees one revision: while its pin (``new_pin``, taken at its first decision) is ``deciding``, every decision
of the call (in its task and the tasks it starts) comes from the set in force at its first decision, even if a
reload swaps another in meanwhile. The set replaced last stays open for such calls until the next swap; a call still
deciding after two swaps (seconds apart at least) gets the set in force.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Protocol

from sidecar.contract import ReloadStatus
from sidecar.errors import PolicyLoadError
from sidecar.metrics import Metrics
from sidecar.policy.decision import Decision, Stage
from sidecar.policy.engine import DelegatingEngine, PolicyEngine
from sidecar.policy.history import HistoryNeeds
from sidecar.policy.input import PolicyInput

__all__ = ["Loaded", "Pin", "PolicyCheck", "PolicySource", "ReloadingEngine", "new_pin"]

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


# Checks an engine just loaded, before it serves: ``PolicyLoadError`` refuses it.
PolicyCheck = Callable[[PolicyEngine], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Loaded:
    """One policy set as loaded: its engine, and the facts about it that hold until the next reload."""

    engine: PolicyEngine
    revision: str
    reads_idempotency_key: bool

    @classmethod
    def of(cls, engine: PolicyEngine) -> Loaded:
        """``engine``'s facts, read once."""
        return cls(engine, engine.revision, engine.reads_idempotency_key)


@dataclass(slots=True)
class Pin:
    """The policy set of one call: taken by its first decision, answering every decision made while
    ``deciding`` (what is asked outside its decisions, e.g. a listing, gets the set in force). It holds nothing of
    the call: a context copied during the call (a timer's) keeps no call alive."""

    loaded: Loaded | None = None
    deciding: bool = False


_PIN: ContextVar[Pin | None] = ContextVar("toolbooth_policy_pin", default=None)


def new_pin() -> Pin:
    """A new pin, the one of this context from now on: its task and the tasks it starts (a task serves one call at
    a time; the caller keeps the pin with its call)."""
    pin = Pin()
    _PIN.set(pin)
    return pin


class ReloadingEngine(DelegatingEngine):
    """A ``PolicyEngine`` whose policy set can be replaced while it serves.

    Decisions, the revision and the audit masks come from ``loaded``: the set in force, or the one a call
    is pinned to (``new_pin``). ``inner`` is the engine in force.
    """

    def __init__(self, source: PolicySource, engine: PolicyEngine, fingerprint: str,
                 check: PolicyCheck | None = None) -> None:
        super().__init__(engine)
        self._current = Loaded.of(engine)  # the set in force
        self._previous: Loaded | None = None  # the one before it, open for the calls pinned to it
        self._source, self._seen, self._check = source, fingerprint, check
        self.status = ReloadStatus(source.description, engine.revision, _now())
        self.on_status: Callable[[ReloadStatus], Awaitable[None]] | None = None
        self.metrics: Metrics | None = None  # counts each changed set: loaded, refused, or error (unreadable)

    @classmethod
    async def start(cls, source: PolicySource, check: PolicyCheck | None = None) -> ReloadingEngine:
        """Load the first policy set, checked by ``check`` as every later one is; failing here stops start-up."""
        fingerprint = await source.fingerprint()
        return cls(source, await _load(source, check), fingerprint, check)

    async def reload_if_changed(self) -> ReloadStatus:
        """Look at the source once; load and swap in a changed policy set."""
        fingerprint = await self._source.fingerprint()
        if fingerprint == self._seen:
            return self.status
        self._seen = fingerprint  # a refused set is not retried until it changes again
        try:
            engine = await _load(self._source, self._check)
        except PolicyLoadError as exc:
            log.error("policy reload refused, revision %s keeps serving: %s", self.revision, exc)
            self._count("refused")
            await self._set(replace(self.status, last_attempt_at=_now(), last_error=str(exc)))
            return self.status
        closing, self._previous, self._current = self._previous, self._current, Loaded.of(engine)
        self.inner = engine
        if closing is not None:
            await closing.engine.aclose()
        log.info("policy revision %s loaded from %s", engine.revision, self._source.description)
        self._count("loaded")
        now = _now()
        await self._set(ReloadStatus(self._source.description, engine.revision, now, now))
        return self.status

    @property
    def loaded(self) -> Loaded:
        """While a call decides: the set it is pinned to (taken now, at its first decision) if that is still open.
        Else the set in force."""
        pin = _PIN.get()
        if pin is None or not pin.deciding or pin.loaded is self._current:
            return self._current
        return self._pinned(pin)

    def _pinned(self, pin: Pin) -> Loaded:
        """The set ``pin`` holds (the one in force, if it holds none yet) while it is still open, else the set in
        force."""
        if pin.loaded is None:
            pin.loaded = self._current
        return pin.loaded if pin.loaded is self._previous else self._current

    # The reads of every decision: ``loaded``'s first test written out in each, as they run several times a call.

    @property
    def revision(self) -> str:
        """The revision of ``loaded``."""
        pin = _PIN.get()
        if pin is None or not pin.deciding or pin.loaded is self._current:
            return self._current.revision
        return self._pinned(pin).revision

    @property
    def reads_idempotency_key(self) -> bool:
        """Whether the policies of ``loaded`` may read the idempotency key."""
        return self.loaded.reads_idempotency_key

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        """The decision of ``loaded``."""
        pin = _PIN.get()
        if pin is None or not pin.deciding or pin.loaded is self._current:
            return await self._current.engine.decide(stage, input)
        return await self._pinned(pin).engine.decide(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        """The decisions of ``loaded``, in order."""
        return await self.loaded.engine.decide_many(stage, inputs)

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        """The audit masks of ``loaded``."""
        return await self.loaded.engine.audit_masks()

    async def history_needs(self) -> HistoryNeeds:
        """The history needs of ``loaded``."""
        return await self.loaded.engine.history_needs()

    async def aclose(self) -> None:
        """Release the set in force and the one kept open before it."""
        if self._previous is not None:
            await self._previous.engine.aclose()
        await self._current.engine.aclose()

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


async def _load(source: PolicySource, check: PolicyCheck | None) -> PolicyEngine:
    """``source``'s set, loaded and passed by ``check``; one it refuses is closed."""
    engine = await source.load()
    if check is not None:
        try:
            await check(engine)
        except BaseException:
            await engine.aclose()
            raise
    return engine


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
