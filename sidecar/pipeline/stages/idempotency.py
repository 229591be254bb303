"""Stage 8, idempotency: a call of a tool with side effects runs at most once per key.

Such a call must carry an ``idempotency_key``. Claiming it finds one of: nothing (this call owns
the key and runs), the same request finished (its stored result is replayed), still running
(``OPERATION_IN_PROGRESS``), of unknown outcome because its handler outlived its deadline, its
worker process ended while it ran or its sidecar stopped mid-call (also ``OPERATION_IN_PROGRESS``: never
run again; settled by its handler's late result or by an operator), or a different request
(``IDEMPOTENCY_KEY_REUSED``).

From its claim on (``call.claim``: its key and its handler's deadline), a keyed call is detached from its caller
(``call.detached``; the stages after this one run in a task of their own, which the caller's cancellation does not
reach): it runs to its end, and its outcome is stored and audited, even if the caller goes away or its deadline
passes. Its handler's deadline is the tool's timeout, not the caller's (``Call.handler_deadline``); a handler that
has not started by the caller's
deadline does not start (``TIMEOUT``, nothing ran, the key released). So a retry after the caller's
deadline gets ``OPERATION_IN_PROGRESS`` while the write runs, then its stored result. At shutdown
(``stop_by``) no handler runs past the end of the grace: one still running then is stopped as at its
deadline (its key unknown). A claimed key is always completed or
released, never left "in progress": a store that cannot take the outcome keeps it in its local
journal and applies it before the key is claimed or read again, so a retry replays the real
result. Only when the journal cannot take it either does the key turn unknown (past its deadline),
for an operator to settle: it never runs again. The dispatch is audited durably before the handler
runs; if that write fails the key is released and nothing runs.

A handler whose outcome is not known (``call.dispatched.unknown``: it outlived the deadline and the caller got
``TIMEOUT``, or its worker process ended while it ran) may have had its effect: its error is not stored, its
record is marked unknown. A sync handler's thread runs on (``call.dispatched.late``); when it ends, its own
result is stored under the key (unless an operator resolved it first) and audited, so retries replay it. An
async handler was cancelled, an isolated sync handler's worker process killed or dead: an operator settles it.

A key is released, not completed, when the call certainly had no effect (``had_no_effect``): its
handler never started (a later stage refused it, e.g. its approval was already used, or its
deadline passed while the key was being claimed) or its tool said nothing happened. A retry with
the key then runs; a stored result would have burned the key with nothing run.

Each store operation is a span ``store {operation}`` when the sidecar traces. ``aclose`` stops the expiry of
finished records (``Expiry``), which each claim pokes.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sidecar.contract import ErrorCode, ErrorInfo, OperationState, ToolResult
from sidecar.errors import CallRefused, StoreUnavailableError, refusal
from sidecar.pipeline import results
from sidecar.pipeline.call import Call, KeyClaim
from sidecar.pipeline.chain import Next
from sidecar.pipeline.stages.audit import Auditor
from sidecar.state import Claim, Expiry, KeyScope, Store

__all__ = ["IdempotencyStage", "had_no_effect"]

log = logging.getLogger("toolbooth.pipeline")


class IdempotencyStage:
    """Claims the key of a call with side effects, runs the rest of the chain detached, stores its outcome."""

    def __init__(self, store: Store, auditor: Auditor, expiry: Expiry) -> None:
        self._store, self._auditor, self._expiry = store, auditor, expiry
        self._detached: set[asyncio.Task[ToolResult]] = set()
        self._late: set[asyncio.Task[None]] = set()  # handlers running on past their deadline

    async def run(self, call: Call, next: Next) -> ToolResult:
        if not call.defn.requires_idempotency_key:
            return await next(call)
        scope = _scope(call)
        call.claim = KeyClaim(scope, time.monotonic() + call.defn.timeout)
        task = asyncio.create_task(self._detached_call(call, scope, next))
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        return await asyncio.shield(task)

    async def aclose(self) -> None:
        """Stop deleting finished records past their retention."""
        await self._expiry.aclose()

    async def drain(self, *, until: float | None) -> None:
        """Wait for every detached call (each is bounded by its own deadline, and by shutdown's bound
        ``Dispatcher.stop_by``), then for the late handlers of writes until ``until`` (``time.monotonic()``;
        ``None``: not at all)."""
        if self._detached:
            log.info("waiting for %d started write(s) to finish", len(self._detached))
            await asyncio.gather(*self._detached, return_exceptions=True)
        if self._late and until is not None:
            await asyncio.wait(self._late, timeout=max(0.0, until - time.monotonic()))
        if self._late:  # past the bound: their keys stay unknown, for an operator to resolve
            log.warning("%d write(s) that outlived their deadline still run; their outcome stays unknown",
                        len(self._late))
            for task in self._late:
                task.cancel()
            await asyncio.gather(*self._late, return_exceptions=True)

    async def _detached_call(self, call: Call, scope: KeyScope, next: Next) -> ToolResult:
        try:
            result = await self._claimed(call, scope, next)
        except CallRefused as refused:
            result = results.refused(call, refused)
        self._auditor.outcome(call, result)
        return result

    async def _claimed(self, call: Call, scope: KeyScope, next: Next) -> ToolResult:
        deadline_at = time.time() + (call.handler_deadline() - time.monotonic())  # the claim's, as wall-clock time
        try:
            with call.span("store", "claim"):
                claim = await self._store.claim(scope, call.request_hash, call.request_id, deadline_at=deadline_at,
                                                legacy_hash=call.legacy_request_hash)
        except StoreUnavailableError as exc:
            log.error("store unavailable: %s", exc)
            raise CallRefused(refusal(exc, consequence="nothing was executed")) from None
        if not claim.claimed:
            return _not_ours(call, claim)
        self._expiry.poke()
        await self._record_dispatch(call, scope)
        result = await next(call)
        await self._finish(call, scope, result)
        return result

    async def _record_dispatch(self, call: Call, key: KeyScope) -> None:
        try:
            with call.span("store", "record_audit"):
                await self._auditor.dispatching(call)
        except StoreUnavailableError as exc:
            await self._release(call, key)
            log.error("audit write failed before dispatch of request %s: %s", call.request_id, exc)
            raise CallRefused(refusal(exc, consequence="nothing was executed", part="the audit log")) from None

    async def _finish(self, call: Call, key: KeyScope, result: ToolResult) -> None:
        """Store the outcome under ``key``; forget the key if the call certainly had no effect; mark it
        unknown if the handler's outcome is not known, and store the handler's own result when it ends."""
        dispatched = call.dispatched
        if dispatched is None or not dispatched.unknown:
            await self._settle(call, key, result)
            return
        try:
            with call.span("store", "mark_overran"):
                await self._store.mark_overran(key, now=time.time())
        except StoreUnavailableError as exc:  # it turns unknown anyway, past its deadline plus the grace
            log.error("could not mark the key of request %s unknown: %s", call.request_id, exc)
        if dispatched.late is not None:
            task = asyncio.create_task(self._settle_late(call, key, dispatched.late))
            self._late.add(task)
            task.add_done_callback(self._late.discard)

    async def _settle_late(self, call: Call, key: KeyScope, late: asyncio.Future[ToolResult]) -> None:
        """Store and audit the result of a handler that ended after its deadline."""
        result = await late
        log.warning("request %s: tool %r ended after its deadline (%s); its result settles its key",
                    call.request_id, call.defn.name, result.status.value)
        await self._settle(call, key, result)
        self._auditor.outcome(call, result)

    async def _settle(self, call: Call, key: KeyScope, result: ToolResult) -> None:
        if had_no_effect(call, result):
            await self._release(call, key)
            return
        try:
            with call.span("store", "complete"):
                await self._store.complete(key, result.model_dump_json(), request_id=call.request_id)
        except StoreUnavailableError as exc:  # neither the store nor its local journal took it
            log.critical("the result of request %s could not be stored under its key, nor kept locally (%s): "
                         "its key turns unknown, never runs again, and an operator settles it", call.request_id, exc)

    async def _release(self, call: Call, key: KeyScope) -> None:
        try:
            with call.span("store", "release"):
                await self._store.release(key, request_id=call.request_id)
        except StoreUnavailableError as exc:  # neither the store nor its local journal took it
            log.error("could not release idempotency key of request %s: %s; it turns unknown", call.request_id, exc)


def had_no_effect(call: Call, result: ToolResult) -> bool:
    """Whether ``call`` certainly changed nothing: its handler never started (``call.attempts`` is 0: a
    later stage refused it, or its deadline passed first), or the tool said nothing happened (a retryable
    error other than ``TIMEOUT``, which may come after an effect)."""
    if call.attempts == 0:
        return True
    error = result.error
    return error is not None and error.retryable and error.code is not ErrorCode.TIMEOUT


def _scope(call: Call) -> KeyScope:
    """The key's scope (principal, tool), or ``INVALID_ARGUMENT`` for a missing key (its size and characters
    were checked by the request stage)."""
    key = call.request.idempotency_key
    if not key:
        raise CallRefused(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, f"tool {call.defn.name!r} has side effects: an "
                                       "idempotency_key is required", field="idempotency_key"))
    return KeyScope(call.principal.tenant, call.principal.id, call.defn.name, key)


def _not_ours(call: Call, claim: Claim) -> ToolResult:
    """The answer when the key is held by an earlier call: its replayed result, or why not."""
    record = claim.record
    assert record is not None
    if claim.reused:
        raise CallRefused(ErrorInfo.of(ErrorCode.IDEMPOTENCY_KEY_REUSED, "this idempotency key was used for a "
                                       "different request", field="idempotency_key"))
    if record.state is OperationState.IN_PROGRESS:
        message = "a call with this idempotency key is still running"
    elif record.state is OperationState.UNKNOWN:
        message = ("the outcome of the call with this idempotency key is unknown (its handler outlived its deadline, "
                   "its process ended or its sidecar stopped while it ran); it is not run again: its handler's own "
                   "result, once it ends, or an operator (toolbooth operations resolve) settles it")
    else:
        assert record.result_json is not None
        return results.replayed(call, record.result_json)
    raise CallRefused(ErrorInfo.of(ErrorCode.OPERATION_IN_PROGRESS, message, field="idempotency_key"))
