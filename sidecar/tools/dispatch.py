"""Stage 10 (dispatch, ``sidecar.pipeline.order``): run a handler within its deadline, retrying only where that is safe.

Async handlers are awaited and cancelled at the deadline. Sync handlers run in a
bounded thread pool; at the deadline the caller gets ``TIMEOUT`` at once, but the
thread itself cannot be interrupted and finishes in the background: for a tool with side
effects, ``Outcome.late`` then gives its real outcome when it ends (one still queued in
the pool is cancelled instead: it never ran). A handler whose outcome is not known
(``Outcome.unknown``: it outlived the deadline, or its worker process ended while it ran) may have
had its effect. Whatever a handler
raises (``SystemExit``, ``KeyboardInterrupt``, a ``CancelledError`` of its own, any other
``BaseException``) ends that call with ``INTERNAL_ERROR``, logged, never the sidecar; only a
cancellation of the call itself passes through. No attempt starts after ``start_by`` (the caller's
deadline, for a write whose own deadline is its tool's timeout), and at shutdown no handler runs past
``stop_by``'s moment: one still running then is stopped as at its deadline.

Isolated sync handlers (``isolation`` in the config: ``sidecar.tools.isolation``) run in a worker
process of their plugin instead, so their deadline is real: at the deadline (or when the call is
cancelled) that call's worker is stopped (SIGTERM, SIGKILL after the grace), the caller gets
``TIMEOUT`` once it is gone, and the worker is replaced; other calls go on. A killed handler had an
unknown effect: ``unknown`` and no ``late`` (for a write, its key stays unknown until an operator
settles it). A worker that ends mid-call (``os._exit``, a signal, the OOM killer) after the call
reached it ends it with ``INTERNAL_ERROR``, logged: for a tool with side effects its outcome is
``unknown`` too (recovery ``check_operation_status``: the handler may have had its effect), for a read a
plain failure. One that had ended before the call reached it ran nothing: ``SERVICE_UNAVAILABLE``,
retryable. A call still waiting for a free worker (or thread) at its deadline, or at ``start_by``, never
started: it is taken out of the queue.
Other sync handlers share the sidecar's process: one that hangs or corrupts it is not contained.
Only ``SideEffect.NONE`` tools may carry a retry policy (checked by ``@tool``). With its ``attempt_timeout``
each attempt has a deadline of its own, within the call's: an attempt that hangs ends with ``TIMEOUT``
(an async handler cancelled, a sync one left to finish in its thread, an isolated one stopped) in time
for the next attempt.

A handler returns its output model (or data that fits it), or ``Partial(output, errors=[...])``: the
output, checked the same way, and its failed parts as errors (``Outcome.failed``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ValidationError

from sidecar.contract import ErrorCode, ErrorInfo, SideEffect, guidance
from sidecar.tools.definition import ToolContext, ToolDefinition
from sidecar.tools.isolation.pool import ProcessPools
from sidecar.tools.isolation.process import HandlerFailed, WorkerLost
from sidecar.tools.outcomes import Partial, ToolError, published

__all__ = ["Dispatcher", "Outcome"]

log = logging.getLogger("toolbooth.dispatch")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What dispatch produced: an output model or an error, and the attempts made (whose handler started:
    0 when the deadline passed before the first). ``unknown``: the last attempt's handler may or may not
    have had its effect and its outcome is not known: it outlived the deadline (``TIMEOUT``), or the worker
    process of an isolated write ended while it ran (``INTERNAL_ERROR``, recovery ``check_operation_status``);
    ``late``: that handler, a sync one of a tool with side effects in the thread pool, still runs, and this
    future gives its own outcome when it ends (an isolated one was killed, or died: no ``late``, its effect
    stays unknown). ``failed``: with an output, the parts that failed (the handler returned a ``Partial``);
    ``labels``: with an output, the labels its attempt's handler added to it."""

    output: BaseModel | None
    error: ErrorInfo | None
    attempts: int
    unknown: bool = False
    late: asyncio.Future[Outcome] | None = None
    failed: tuple[ErrorInfo, ...] = ()
    labels: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Produced:
    """What a handler returned, checked: its output and the errors of the parts that failed."""

    output: BaseModel
    failed: tuple[ErrorInfo, ...] = ()

    def outcome(self, attempts: int, labels: frozenset[str] = frozenset()) -> Outcome:
        return Outcome(self.output, None, attempts, failed=self.failed, labels=labels)


@dataclass(frozen=True, slots=True)
class _Unsettled:
    """An attempt whose handler may have had its effect, with no outcome: it outlived the deadline (the
    caller's ``TIMEOUT``, and the handler still running, a sync one in the thread pool, if any) or its
    worker process ended while it ran."""

    error: ErrorInfo
    running: asyncio.Future[Any] | None


class _NotStarted:
    """An attempt whose sync handler was still queued at the deadline (for a thread or a worker process):
    it never ran."""


class Dispatcher:
    """Invokes handlers with deadlines, retries, a bounded thread pool for sync handlers and the worker
    processes of isolated ones (``pools``)."""

    def __init__(self, *, sync_threads: int, pools: ProcessPools) -> None:
        self._threads = ThreadPoolExecutor(max_workers=sync_threads, thread_name_prefix="toolbooth-handler")
        self._pools = pools
        self._stop_at: float | None = None  # ``time.monotonic()``: at shutdown, no handler runs past it
        self._deadlines: set[asyncio.Timeout] = set()  # of the attempts running now

    async def run(self, defn: ToolDefinition[Any, Any], args: BaseModel, ctx: ToolContext, *,
                  start_by: float | None = None) -> Outcome:
        """Call ``defn``'s handler until success, a final error or the deadline; no attempt starts after
        ``start_by`` (``time.monotonic()``) either."""
        attempt = 1
        while True:
            ctx = replace(ctx, attempt=attempt, labels=set())  # an attempt's labels are its result's alone
            latest = self._end_of(ctx) if start_by is None else min(self._end_of(ctx), start_by)
            if latest <= time.monotonic():  # this attempt never starts
                return _not_run(attempt - 1)
            attempted = await self._attempt(defn, args, _for_attempt(defn, ctx), start_by)
            if isinstance(attempted, _NotStarted):  # still queued at its deadline: it never ran
                if self._end_of(ctx) > time.monotonic():  # only the attempt's own deadline passed: queue it again
                    continue
                return _not_run(attempt - 1)
            if isinstance(attempted, _Produced):
                return attempted.outcome(attempt, frozenset(ctx.labels))
            unsettled, error = (attempted, attempted.error) if isinstance(attempted, _Unsettled) else (None, attempted)
            delay = defn.retry.backoff(attempt)
            if not _should_retry(defn, error, attempt, delay, ctx):
                if unsettled is None:
                    return Outcome(None, error, attempt)
                return Outcome(None, error, attempt, unknown=True, late=_late(unsettled, defn, ctx, attempt))
            ctx.logger.info("retrying after %s (attempt %d)", error.code, attempt)
            await asyncio.sleep(delay)
            attempt += 1

    async def start(self) -> None:
        """Start the worker processes of the isolated tools; ``PluginLoadError`` if one cannot import them."""
        await self._pools.start()

    def stop_by(self, at: float) -> None:
        """Shutdown's bound: no handler runs past ``at`` (``time.monotonic()``, the earliest one given wins);
        one still running then is stopped as at its deadline (its outcome ``unknown``)."""
        self._stop_at = at if self._stop_at is None else min(self._stop_at, at)
        moment = _loop_time(self._stop_at)
        for deadline in self._deadlines:
            when = deadline.when()
            assert when is not None  # every one is scheduled (``_bounded``)
            if not deadline.expired() and when > moment:
                deadline.reschedule(moment)

    @property
    def stop_at(self) -> float | None:
        """Shutdown's bound (``time.monotonic()``), once ``stop_by`` gave one."""
        return self._stop_at

    def _end_of(self, ctx: ToolContext) -> float:
        """When an attempt with ``ctx`` must end: its deadline, or shutdown's bound if that is earlier."""
        return ctx.deadline if self._stop_at is None else min(ctx.deadline, self._stop_at)

    async def aclose(self) -> None:
        """Stop accepting sync handlers (running threads finish in the background); stop the worker processes
        (within their grace, then killed)."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        await self._pools.aclose()

    async def _attempt(
        self, defn: ToolDefinition[Any, Any], args: BaseModel, ctx: ToolContext, start_by: float | None
    ) -> _Produced | ErrorInfo | _Unsettled | _NotStarted:
        """One attempt. Until its handler starts (a sync one waits for a thread or a worker process) it is bounded
        by ``start_by`` too: one still waiting then never starts."""
        remaining = self._end_of(ctx) - time.monotonic()
        job: Future[Any] | None = None
        running: asyncio.Future[Any] | None = None
        started = True  # False while an isolated call waits for a free worker
        pool = self._pools.get(defn.name)
        try:
            if pool is None and not defn.is_async:  # in a thread, once one is free
                job = self._threads.submit(_unless_late, defn.handler, args, ctx, start_by)
                running = asyncio.wrap_future(job)
                if not await self._started(job, running, ctx, start_by):
                    return _NotStarted()
            bound = self._end_of(ctx) if pool is None else _earliest(self._end_of(ctx), start_by)
            async with self._bounded(bound) as deadline:
                if pool is not None:
                    started = False
                    async with pool.lease() as worker:  # interrupted: that worker is stopped before it ends
                        started = True
                        deadline.reschedule(_loop_time(self._end_of(ctx)))  # it starts: bounded by its own end
                        return await _settled(worker.call(defn.name, args, ctx), defn, ctx)
                if running is None:
                    pending: Awaitable[Any] = defn.handler(args, ctx)  # type: ignore[assignment]
                else:
                    pending = asyncio.shield(running)  # at the deadline the thread runs on: ``running`` stays
                return await _settled(pending, defn, ctx)
        except TimeoutError:  # the deadline's: a handler's own TimeoutError is ``_settled``'s
            if not started:
                return _NotStarted()
            return _unsettled(ErrorCode.TIMEOUT, f"tool {defn.name!r} did not finish within {remaining * 1000:.0f} ms",
                              defn, running)
        except asyncio.CancelledError:  # the call itself is cancelled (its caller went away, the server stops)
            if job is not None:
                job.cancel()  # one still queued never starts
            raise
        except WorkerLost as lost:  # the isolated handler's process ended before it answered
            return _lost(lost, defn, ctx)
        except BaseException as exc:  # noqa: BLE001 - the pool refused the handler (shut down, or no workers)
            return _unexpected(exc, defn, ctx)

    async def _started(self, job: Future[Any], running: asyncio.Future[Any], ctx: ToolContext,
                       start_by: float | None) -> bool:
        """Whether the sync handler's thread ``job`` started by the attempt's end and ``start_by``; if not, it
        is taken out of the pool's queue (or it refused to start late: ``_Late``) and never runs."""
        try:
            async with self._bounded(_earliest(self._end_of(ctx), start_by)):
                await asyncio.wait({running})  # whatever its outcome: ``_settled``'s
        except TimeoutError:
            if job.cancel():  # still queued: it never runs
                return False
        return not (job.done() and isinstance(job.exception(), _Late))

    def _bounded(self, at: float) -> _Bounded:
        """A deadline at ``at`` (``time.monotonic()``) around the block, which ``stop_by`` may bring forward."""
        return _Bounded(self._deadlines, asyncio.timeout_at(_loop_time(at)))


class _Bounded:
    """``deadline`` (an ``asyncio.timeout_at``) around a block, in ``deadlines`` while the block runs. A class, not
    an ``asynccontextmanager``: one is entered on every call."""

    __slots__ = ("_deadline", "_deadlines")

    def __init__(self, deadlines: set[asyncio.Timeout], deadline: asyncio.Timeout) -> None:
        self._deadlines, self._deadline = deadlines, deadline

    async def __aenter__(self) -> asyncio.Timeout:
        deadline = await self._deadline.__aenter__()
        self._deadlines.add(deadline)
        return deadline

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self._deadlines.discard(self._deadline)
        await self._deadline.__aexit__(kind, exc, traceback)  # turns the deadline's cancellation into TimeoutError


class _Late(Exception):
    """A sync handler's thread was free only after its ``start_by``: the handler did not start."""


def _unless_late(handler: Any, args: BaseModel, ctx: ToolContext, start_by: float | None) -> Any:
    """Run ``handler`` in this thread, unless ``start_by`` has passed (the event loop may not yet have taken the
    job out of the queue)."""
    if start_by is not None and time.monotonic() >= start_by:
        raise _Late
    return handler(args, ctx)


def _earliest(end: float, start_by: float | None) -> float:
    return end if start_by is None else min(end, start_by)


def _loop_time(at: float) -> float:
    """``at`` (``time.monotonic()``) on the running event loop's clock."""
    return asyncio.get_running_loop().time() + (at - time.monotonic())


async def _settled(pending: Awaitable[Any], defn: ToolDefinition[Any, Any], ctx: ToolContext) -> _Produced | ErrorInfo:
    """The handler's output, checked, or its failure as an error; only a cancellation of the call, and the
    loss of an isolated handler's worker process (``WorkerLost``: no outcome at all), pass."""
    try:
        result = await pending
    except ToolError as exc:
        return published(exc, defn.side_effect)
    except WorkerLost:
        raise
    except asyncio.CancelledError as exc:
        if _cancelling():
            raise  # the call itself is cancelled, or its deadline passed
        return _unexpected(exc, defn, ctx)  # raised by the handler, not by a cancellation of the call
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: never the sidecar's end
        return _unexpected(exc, defn, ctx)
    return _checked_output(defn, result, ctx)


def _for_attempt(defn: ToolDefinition[Any, Any], ctx: ToolContext) -> ToolContext:
    """``ctx`` with the deadline of one attempt: the call's, or sooner by the retry policy's ``attempt_timeout``."""
    limit = defn.retry.attempt_timeout
    return ctx if limit is None else replace(ctx, deadline=min(ctx.deadline, time.monotonic() + limit))


def _not_run(attempts: int) -> Outcome:
    """The deadline passed before the handler started: nothing ran, so a retry is safe for any tool."""
    return Outcome(None, ErrorInfo.of(ErrorCode.TIMEOUT, "the call's deadline passed before the tool ran"), attempts)


def _late(unsettled: _Unsettled, defn: ToolDefinition[Any, Any], ctx: ToolContext,
          attempt: int) -> asyncio.Future[Outcome] | None:
    """The outcome of a sync handler of a tool with side effects that runs on after the deadline."""
    if unsettled.running is None or not defn.requires_idempotency_key:
        return None
    running = unsettled.running

    async def outcome() -> Outcome:
        settled = await _settled(running, defn, ctx)
        if isinstance(settled, ErrorInfo):
            return Outcome(None, settled, attempt)
        return settled.outcome(attempt)

    return asyncio.ensure_future(outcome())


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _unsettled(code: ErrorCode, message: str, defn: ToolDefinition[Any, Any],
               running: asyncio.Future[Any] | None = None) -> _Unsettled:
    """An attempt whose handler may have had its effect, its outcome unknown: ``code``, guided as its tool's
    ``TIMEOUT`` is (for a tool with side effects: not retryable, ``check_operation_status``)."""
    retryable, recovery = guidance(ErrorCode.TIMEOUT, defn.side_effect)
    return _Unsettled(ErrorInfo(code=code, message=message, retryable=retryable, recovery=recovery), running)


def _lost(lost: WorkerLost, defn: ToolDefinition[Any, Any], ctx: ToolContext) -> ErrorInfo | _Unsettled:
    """The answer when an isolated handler's worker process ended before it answered: nothing ran if the call
    never reached it; else a read failed, and a write's outcome is unknown (it may have had its effect)."""
    failed = _unexpected(lost, defn, ctx)  # logged; what a read answers
    if not lost.delivered:
        return ErrorInfo.of(ErrorCode.SERVICE_UNAVAILABLE, "the tool's worker process ended before the call "
                            "reached it; nothing ran")
    if defn.side_effect is SideEffect.NONE:
        return failed
    return _unsettled(ErrorCode.INTERNAL_ERROR, "the tool's process ended while it ran: its effect may or may not "
                      "have happened; check the operation's status", defn)


def _unexpected(exc: BaseException, defn: ToolDefinition[Any, Any], ctx: ToolContext) -> ErrorInfo:
    """The handler's own failure: its details go to the log, the caller gets ``INTERNAL_ERROR``."""
    if isinstance(exc, HandlerFailed):  # in a worker process (or with it: ``WorkerLost``): its traceback is text
        ctx.logger.error("handler of tool %r failed: %s", defn.name, exc)
    else:
        ctx.logger.error("handler of tool %r raised %s", defn.name, type(exc).__name__, exc_info=exc)
    return ErrorInfo.of(ErrorCode.INTERNAL_ERROR, "the tool failed unexpectedly")


def _should_retry(defn: ToolDefinition[Any, Any], error: ErrorInfo, attempt: int, delay: float,
                  ctx: ToolContext) -> bool:
    return (
        error.retryable
        and error.code in defn.retry.retry_on
        and attempt < defn.retry.max_attempts
        and ctx.time_remaining() > delay
    )


def _checked_output(defn: ToolDefinition[Any, Any], result: Any, ctx: ToolContext) -> _Produced | ErrorInfo:
    """What the handler returned, checked against the output model (a ``Partial``'s output too)."""
    failed: tuple[ErrorInfo, ...] = ()
    if isinstance(result, Partial):
        failed = tuple(published(error, defn.side_effect) for error in result.errors)
        result = result.output
    model: type[BaseModel] = defn.output_model
    if isinstance(result, model):
        return _Produced(result, failed)
    try:
        return _Produced(model.model_validate(result), failed)
    except ValidationError as exc:  # its text shows the values, which may echo sensitive arguments: not logged
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(value)'}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False))
        ctx.logger.error("tool %r returned a value that does not fit %s: %s", defn.name, defn.output_model.__name__,
                         problems)
        return ErrorInfo.of(ErrorCode.INTERNAL_ERROR, "the tool returned an invalid result")
