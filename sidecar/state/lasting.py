"""Writes that must not be lost: retried within bounds, else kept in the local journal and applied later.

``Lasting.write`` makes a write in the store, trying again for at most ``RETRY_SECONDS``. A write the
store still cannot take is kept in the ``Journal`` (durable on return) and applied, in order, by a
background task as soon as the store takes writes again, pausing longer between tries up to
``LONGEST_PAUSE_SECONDS``. While writes are kept, audit rows join them at once (so the chain keeps
their order, and each batch does not wait for a store known to be failing); outcomes still try the
store first. ``catch_up`` applies the kept outcomes before anything claims or reads a key, so a retry
replays the real result and a released key can be claimed again; kept audit rows follow in the
background (each kind in its order; the two are independent). The journal is read ``PAGE`` writes at a time,
one kind at a time, so a catch-up after a long outage holds a page in memory, not the outage; the audit rows of
a page are appended as one batch and forgotten in one journal transaction (a crash between the two appends
that page again: the same events twice, never a gap), so they are applied faster than a loaded sidecar adds to
them, and the journal empties. A try that fails while other callers
wait their turn fails them too, at once: none waits out a failing store behind the others. Shutdown
tries once more unless the last try failed; what is still kept then is applied at the next start. A
write the store refuses for its data (``StoreRefusedError``) is neither retried nor kept: it would
fail again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from sidecar.errors import StoreRefusedError, StoreUnavailableError
from sidecar.state.journal import AuditRows, Journal, JournalEntry, Write

__all__ = ["LONGEST_PAUSE_SECONDS", "PAGE", "RETRY_SECONDS", "Lasting", "retried"]

RETRY_SECONDS = 1.0
LONGEST_PAUSE_SECONDS = 5.0
PAGE = 16  # kept writes read from the journal at once: all a catch-up holds, however long the store was away
_FIRST_PAUSE_SECONDS = 0.02
log = logging.getLogger("toolbooth.store")

Apply = Callable[[Write], Awaitable[None]]


async def retried(attempt: Callable[[], Awaitable[None]]) -> None:
    """Run ``attempt`` until it succeeds, trying again after a store failure while ``RETRY_SECONDS`` last."""
    deadline, pause = time.monotonic() + RETRY_SECONDS, _FIRST_PAUSE_SECONDS
    while True:
        try:
            await attempt()
            return
        except StoreRefusedError:
            raise
        except StoreUnavailableError:
            if time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause *= 2


class Lasting:
    """Makes writes with ``apply``; keeps those the store cannot take in ``journal`` (``None``: raises instead)."""

    def __init__(self, apply: Apply, journal: Journal | None = None) -> None:
        self._apply, self.journal = apply, journal
        self._lock = asyncio.Lock()
        self._replayer: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()  # set by ``aclose``: the replayer ends after the try it is making
        self._failing = False  # the last try to apply kept writes failed
        self._failures = 0  # tries that failed so far
        self._failure: StoreUnavailableError | None = None  # the last one's error

    @property
    def behind(self) -> bool:
        """Whether writes are kept that the store has not taken yet."""
        return self.journal is not None and self.journal.size > 0

    async def write(self, write: Write) -> None:
        """Make ``write`` in the store, else keep it in the journal; durable on return. Raises
        ``StoreRefusedError`` for data the store refuses, ``StoreUnavailableError`` if neither takes it."""
        if isinstance(write, AuditRows) and self.journal is not None and self.behind:
            await self.journal.keep(write)  # after the kept ones, in order
            self.replay_soon()
            return
        try:
            await retried(lambda: self._apply(write))
        except StoreRefusedError:
            raise
        except StoreUnavailableError as exc:
            if self.journal is None:
                raise
            await self.journal.keep(write)
            self._failing = True
            log.warning("the store cannot take a write (%s); it is kept in the local journal %s and applied "
                        "when the store is back", exc, self.journal.path)
            self.replay_soon()

    async def catch_up(self, *, audit: bool = False) -> None:
        """Apply the kept writes, oldest first: the outcomes, then audit rows too if ``audit`` (the two are
        independent: a claim waits only for the outcomes). ``StoreUnavailableError`` if the store still cannot
        take them (those stay kept), also when a try made while this one waited its turn failed: callers do not
        queue up, each waiting out a failing store in turn."""
        await self._catch_up(audit=False)
        if audit:
            await self._catch_up(audit=True)

    async def _catch_up(self, *, audit: bool) -> None:
        if self.journal is None or not (self.journal.size - self.journal.outcomes if audit else self.journal.outcomes):
            return
        failures = self._failures
        async with self._lock:
            if self._failures != failures and self._failure is not None:
                raise StoreUnavailableError(f"the store cannot take the kept writes: {self._failure}")
            try:
                await self._apply_kept(self.journal, audit=audit)
            except StoreUnavailableError as exc:
                self._failing, self._failure = True, exc
                self._failures += 1
                raise
            self._failing = False

    async def _apply_kept(self, journal: Journal, *, audit: bool) -> None:
        """Apply the writes of one kind kept so far, oldest first, read ``PAGE`` at a time (those kept meanwhile
        are the next try's: callers waiting for the lock are not held up by a journal that keeps growing)."""
        after, until = 0, journal.newest
        while page := await journal.entries(outcomes=not audit, after=after, until=until, limit=PAGE):
            if not (audit and await self._applied_together(journal, page)):
                for entry in page:
                    await self._apply_entry(journal, entry)
            after = page[-1].ident

    async def _applied_together(self, journal: Journal, page: list[JournalEntry]) -> bool:
        """Whether the audit rows of ``page`` were appended as one batch (one transaction), and forgotten: kept
        rows are applied faster than a loaded sidecar adds to them, so the journal empties. False if the store
        refuses a row of them: then each entry is applied alone, and only one the store refuses is dropped."""
        rows = tuple(row for entry in page if isinstance(entry.write, AuditRows) for row in entry.write.rows)
        if await self._refusal(AuditRows(rows)) is not None:
            return False
        await journal.forget(*page)
        return True

    async def _apply_entry(self, journal: Journal, entry: JournalEntry) -> None:
        refused = await self._refusal(entry.write)
        if isinstance(refused, StoreRefusedError):
            log.error("a write kept in the local journal is refused by the store, dropped: %s", refused)
        elif refused is not None:
            log.error("a write kept in the local journal cannot be applied, dropped: %s", refused)
        await journal.forget(entry)

    async def _refusal(self, write: Write) -> Exception | None:
        """Apply ``write``: ``None`` once the store took it, else why its data was refused (the store's refusal,
        or a row the chain refuses); ``StoreUnavailableError`` when the store cannot take writes at all."""
        try:
            await self._apply(write)
        except StoreRefusedError as exc:
            return exc
        except StoreUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - a row the chain refuses, as the store's refusal
            return exc
        return None

    def replay_soon(self) -> None:
        """Start the background task applying the kept writes, unless it runs (or the writes are closing)."""
        if not self._closing.is_set() and (self._replayer is None or self._replayer.done()):
            self._replayer = asyncio.get_running_loop().create_task(self._replay())

    async def aclose(self) -> None:
        """Stop the background task, try once more to apply what is kept (unless the last try failed: the
        store is down, and shutdown is not held up by it), and close the journal."""
        self._closing.set()
        if self._replayer is not None:  # not cancelled: a write it is applying could land, yet stay kept
            await self._replayer
        if self.journal is None:
            return
        with contextlib.suppress(StoreUnavailableError):
            if not self._failing:
                await self.catch_up(audit=True)
        if self.behind:
            log.warning("%d write(s) stay in the local journal %s; they are applied at the next start",
                        self.journal.size, self.journal.path)
        self.journal.close()

    async def _replay(self) -> None:
        pause = _FIRST_PAUSE_SECONDS
        while self.behind:
            await self._rest(pause)
            if self._closing.is_set():
                return
            try:
                await self.catch_up(audit=True)
                pause = _FIRST_PAUSE_SECONDS  # the store is back: what was kept meanwhile follows at once
            except StoreUnavailableError as exc:
                pause = min(pause * 2, LONGEST_PAUSE_SECONDS)
                log.debug("the store cannot take the kept writes yet (%s); next try in %.2f s", exc, pause)
            except Exception:  # a journal that cannot be read: said loudly, tried again, never a dead task
                pause = LONGEST_PAUSE_SECONDS
                log.exception("the kept writes of the local journal %s cannot be applied",
                              self.journal.path if self.journal else None)
        log.info("every write kept in the local journal is now in the store")

    async def _rest(self, seconds: float) -> None:
        """Wait ``seconds`` between tries, less if the writes are closing."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)
