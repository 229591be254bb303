"""``StoreHistory``: a call's history counted in the store (``sidecar.state.HistoryLog``), shared by every sidecar
that shares it.

**Meters.** For each meter that applies to the call, its place is reserved in the same transaction that counts the
meter (under a lock of the meter's key; one transaction for all of them and the conversation's read:
``HistoryLog.reserve``), so calls being decided are counted, not only finished ones: of any number of concurrent
callers, in any number of sidecars sharing the database, each sees the ones before it, and a limit of N lets N
through. Calls of one idempotency key (a write and its retries, which run at most once) count as one call, as long
as any of them holds its place. A call that does not run (refused, held for
approval, replayed, or whose handler never started) gives its places back once it ended, so it does not consume the
limit; one whose caller went away before it ran gives them back soon after; one the store could not take back is
tried again in the background (at growing intervals, up to 30 s) until it can. A place whose call ended with its
sidecar stays counted until it leaves its window (never more calls than the limit, sometimes fewer).

**The conversation** (its labels, the call's earlier failures) is read in one query, over
``store.history_retention_hours``, after which events are deleted (in the background, ``Expiry``). Once a call ran,
the labels its result carries that the conversation did not already have, and its failure (same tool, same
arguments), are written before its caller gets the result (a write's stored result, replayed, brings every label its
tool declares: it may have run in another conversation); a read whose labels cannot be written is answered
``SERVICE_UNAVAILABLE`` instead (what the policies would not know of is not given), a write's result is given and
the failure logged. Only what the policy set reads is recorded.

A store that cannot answer refuses the call (``SERVICE_UNAVAILABLE``, nothing executed), as a policy that cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence

from sidecar.contract import ErrorCode, ErrorInfo, SideEffect, Status, ToolResult
from sidecar.errors import CallRefused, StoreUnavailableError, refusal
from sidecar.pipeline import results
from sidecar.pipeline.call import Call
from sidecar.pipeline.history import Reservation, Seen, amount_of, label_entries, meter_entry
from sidecar.policy.history import HistoryNeeds, Meter, MeterKey, window_problem
from sidecar.state import Conversation, EventKind, Expiry, HistoryEvent, HistoryLog, Place, Store, history_scope

__all__ = ["MAX_CONVERSATION_EVENTS", "StoreHistory"]

_DELIVERED = frozenset({Status.SUCCESS, Status.PARTIAL_SUCCESS})  # results that give their output: their labels
MAX_CONVERSATION_EVENTS = 1000  # a conversation's newest labels and failures its decisions see, at most
_MAX_RETRY_DELAY = 30.0  # seconds between tries to give a place back, at most

log = logging.getLogger("toolbooth.pipeline")


class StoreHistory:
    """The ``HistorySource`` of a sidecar: its store's history log."""

    def __init__(self, store: Store, *, retention_seconds: float, clock: Callable[[], float] = time.time,
                 retry_delay: float = 0.5) -> None:
        self._store, self._retention, self._clock, self._retry_delay = store, retention_seconds, clock, retry_delay
        self._closing = asyncio.Event()
        self._expiry = Expiry(lambda before: store.history.expire(before), retention_seconds, what="history event",
                              aged="recorded")
        self._releasing: set[asyncio.Task[None]] = set()

    @property
    def _log(self) -> HistoryLog:
        return self._store.history

    async def seen(self, call: Call, needs: HistoryNeeds) -> Seen:
        """Count the meters that apply to ``call`` (reserving its places) and read its conversation, in one
        transaction."""
        now = self._clock()
        self._expiry.poke()
        applying = [meter for meter in needs.meters if meter.applies(call.defn.name, call.defn.side_effect)]
        places = [self._place(call, meter, now) for meter in applying]
        reserved = tuple(Reservation(place.scope, now) for place in places)
        read = Conversation(_conversation(call), now - self._retention, call.request_hash,
                            MAX_CONVERSATION_EVENTS) if needs.conversation else None
        try:
            answer = await self._log.reserve(places, now=now, tool=call.defn.name, request_id=call.request_id,
                                             conversation=read)
            meters = {meter.name: meter_entry(meter, counted, place.amount, now)
                      for meter, place, counted in zip(applying, places, answer.counts, strict=True)}
            labels = label_entries((event.name, event.tool, _time(event.at)) for event in answer.events
                                   if event.kind is EventKind.LABEL) if needs.labels else []
            failures = [{"code": event.detail, "time": _time(event.at)} for event in answer.events
                        if event.kind is EventKind.FAILURE] if needs.failures else []
            return Seen.of(meters, failures, call.request.conversation_id, labels, reserved)
        except StoreUnavailableError as exc:
            self._release_soon(call, reserved)  # its transaction may have committed before the answer was lost
            log.error("call history unavailable for request %s: %s", call.request_id, exc)
            raise CallRefused(refusal(exc, consequence="nothing was executed", part="the call history")) from None
        except BaseException:
            self._release_soon(call, reserved)
            raise

    def _place(self, call: Call, meter: Meter, now: float) -> Place:
        if (problem := window_problem(meter, self._retention)) is not None:  # an OPA server changed its policies
            raise CallRefused(ErrorInfo.of(ErrorCode.INTERNAL_ERROR, problem))
        return Place(history_scope("meter", meter.name, *_keys(meter, call)), now - meter.window_seconds,
                     amount_of(meter, call), _key(call))

    async def settle(self, call: Call, needs: HistoryNeeds, seen: Seen, result: ToolResult) -> ToolResult:
        """Give the places of a call that did not run back; record what one that ran adds to its conversation."""
        if call.attempts == 0:
            await self._release(call, seen.reservations)
            if not result.meta.idempotency_replayed:
                return result
        events = self._events(call, needs, seen, result)
        if not events:
            return result
        try:
            await self._log.record(_conversation(call), events, request_id=call.request_id)
        except StoreUnavailableError as exc:
            labelled = any(event.kind is EventKind.LABEL for event in events)
            log.error("the history of request %s could not be recorded: %s", call.request_id, exc)
            if labelled and call.defn.side_effect is SideEffect.NONE:
                return results.error(call, ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, "the call history is "
                                                        "unavailable; the result is not given, as its labels could "
                                                        "not be recorded"))
        return result

    def _events(self, call: Call, needs: HistoryNeeds, seen: Seen, result: ToolResult) -> list[HistoryEvent]:
        now, tool = self._clock(), call.defn.name
        events: list[HistoryEvent] = []
        if needs.labels and result.status in _DELIVERED:
            known = {(entry["label"], entry["tool"]) for entry in seen.labels}
            events.extend(HistoryEvent(EventKind.LABEL, label, tool, "", now)
                          for label in sorted(_labels(call, result)) if (label, tool) not in known)
        if needs.failures and result.status is Status.ERROR and result.error is not None:
            events.append(HistoryEvent(EventKind.FAILURE, call.request_hash, tool, result.error.code.value, now))
        return events

    def abandon(self, call: Call, seen: Seen) -> None:
        """The caller went away: give the places of a call that has not run back, in the background."""
        if call.attempts == 0 and not call.detached:
            self._release_soon(call, list(seen.reservations))

    async def aclose(self) -> None:
        """Give back the places still being given back (one last try each, now) and wait for a running expiry."""
        self._closing.set()
        await asyncio.gather(*self._releasing, return_exceptions=True)
        await self._expiry.aclose()

    def _release_soon(self, call: Call, reserved: Sequence[Reservation], *, tried: bool = False) -> None:
        if reserved:
            task = asyncio.get_running_loop().create_task(self._release_until_done(call, tuple(reserved), tried))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _release(self, call: Call, reserved: Sequence[Reservation]) -> None:
        """Give the places back now, or keep trying in the background: a place the store could not take back
        would hold its meter's limit for the rest of its window."""
        if reserved and not await self._released(call, reserved):
            self._release_soon(call, reserved, tried=True)

    async def _release_until_done(self, call: Call, reserved: Sequence[Reservation], tried: bool) -> None:
        """Try to give the places back until the store takes them (first, unless ``tried`` just now), at growing
        intervals (up to 30 s), while they may still count (their history is kept) and the sidecar runs (then a
        last try)."""
        delay = self._retry_delay
        while tried or not await self._released(call, reserved):
            if self._closing.is_set() or self._clock() - reserved[0].at > self._retention:
                log.error("meter places of request %s stay counted until they leave their window", call.request_id)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)
            delay, tried = min(delay * 2, _MAX_RETRY_DELAY), False

    async def _released(self, call: Call, reserved: Sequence[Reservation]) -> bool:
        try:
            await self._log.release([place.scope for place in reserved], at=reserved[0].at,
                                    request_id=call.request_id)
        except StoreUnavailableError as exc:
            log.warning("meter places of request %s could not be given back yet: %s", call.request_id, exc)
            return False
        return True


def _keys(meter: Meter, call: Call) -> list[str]:
    """What ``meter`` counts ``call`` under, as the parts of its scope: a conversation is its principal's (another
    principal's conversation of the same id is another one; calls without one share one per principal)."""
    principal = call.principal
    conversation = (principal.tenant, principal.id, call.request.conversation_id or "")  # a principal's, as labels
    values = {MeterKey.PRINCIPAL: (principal.tenant, principal.id), MeterKey.TENANT: (principal.tenant,),
              MeterKey.TOOL: (call.defn.name,), MeterKey.CONVERSATION: conversation}
    return [part for key in meter.by for part in (key.value, *values[key])]


def _labels(call: Call, result: ToolResult) -> frozenset[str]:
    """The labels ``result`` brings into the conversation: its handler's; for a write's stored result replayed (which
    may have run in another conversation), every label its tool declares, as what it carried is not kept."""
    if result.meta.idempotency_replayed:
        return call.defn.labels
    return frozenset() if call.dispatched is None else call.dispatched.labels


def _key(call: Call) -> str:
    """The call's idempotency key, as its meters know it (``""``: none): retries of one keyed write are one call."""
    key = call.request.idempotency_key
    if not key:
        return ""
    principal = call.principal
    return history_scope("key", principal.tenant, principal.id, call.defn.name, key)


def _conversation(call: Call) -> str:
    """The scope of the call's conversation: its principal's, by id (calls without one share one)."""
    principal = call.principal
    return history_scope("conversation", principal.tenant, principal.id, call.request.conversation_id or "")


def _time(at: float) -> str:
    """Epoch seconds as ``input.context.time`` writes times (RFC 3339, UTC, seconds)."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
