"""Stage 7: run a handler within its deadline, retrying only where that is safe.

Async handlers are awaited and cancelled at the deadline. Sync handlers run in a
bounded thread pool; at the deadline the caller gets ``TIMEOUT`` at once, but the
thread itself cannot be interrupted and finishes in the background. Whatever a handler
raises (``SystemExit``, ``KeyboardInterrupt``, a ``CancelledError`` of its own, any other
``BaseException``) ends that call with ``INTERNAL_ERROR``, logged, never the sidecar; only a
cancellation of the call itself passes through. Sync handlers share the sidecar's process:
one that hangs or corrupts it is not contained (no process isolation).
Only ``SideEffect.NONE`` tools may carry a retry policy (checked by ``@tool``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from sidecar.contract import ErrorCode, ErrorInfo
from sidecar.tools.definition import ToolContext, ToolDefinition, ToolError

__all__ = ["Dispatcher", "Outcome"]

log = logging.getLogger("toolbooth.dispatch")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What dispatch produced: an output model or an error, and the attempts made (whose handler started:
    0 when the deadline passed before the first)."""

    output: BaseModel | None
    error: ErrorInfo | None
    attempts: int


class Dispatcher:
    """Invokes handlers with deadlines, retries and a bounded pool for sync handlers."""

    def __init__(self, *, sync_threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=sync_threads, thread_name_prefix="toolbooth-handler")

    async def run(self, defn: ToolDefinition[Any, Any], args: BaseModel, ctx: ToolContext) -> Outcome:
        """Call ``defn``'s handler until success, a final error or the deadline."""
        attempt = 1
        while True:
            ctx = replace(ctx, attempt=attempt)
            if ctx.deadline <= time.monotonic():  # this attempt never starts
                return Outcome(None, ErrorInfo.of(ErrorCode.TIMEOUT, "the call's deadline passed before the tool "
                                                  "ran", side_effect=defn.side_effect), attempt - 1)
            error = await self._attempt(defn, args, ctx)
            if not isinstance(error, ErrorInfo):
                return Outcome(error, None, attempt)
            delay = defn.retry.backoff(attempt)
            if not _should_retry(defn, error, attempt, delay, ctx):
                return Outcome(None, error, attempt)
            ctx.logger.info("retrying after %s (attempt %d)", error.code, attempt)
            await asyncio.sleep(delay)
            attempt += 1

    def close(self) -> None:
        """Stop accepting sync handlers; running ones finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _attempt(
        self, defn: ToolDefinition[Any, Any], args: BaseModel, ctx: ToolContext
    ) -> BaseModel | ErrorInfo:
        remaining = ctx.deadline - time.monotonic()
        deadline = asyncio.timeout(remaining)
        try:
            async with deadline:
                result = await self._invoke(defn, args, ctx)
            return _checked_output(defn, result, ctx)
        except ToolError as exc:
            return _published(exc, defn)
        except TimeoutError as exc:
            if deadline.expired():
                return ErrorInfo.of(ErrorCode.TIMEOUT, f"tool {defn.name!r} did not finish within "
                                    f"{remaining * 1000:.0f} ms", side_effect=defn.side_effect)
            return _unexpected(exc, defn, ctx)  # a TimeoutError of the handler's own
        except asyncio.CancelledError as exc:
            if _cancelling():
                raise  # the call itself is cancelled (its caller went away, the server stops)
            return _unexpected(exc, defn, ctx)  # raised by the handler, not by a cancellation of the call
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: never the sidecar's end
            return _unexpected(exc, defn, ctx)

    async def _invoke(self, defn: ToolDefinition[Any, Any], args: BaseModel, ctx: ToolContext) -> Any:
        if defn.is_async:
            return await defn.handler(args, ctx)  # type: ignore[misc]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(defn.handler, args, ctx))


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _unexpected(exc: BaseException, defn: ToolDefinition[Any, Any], ctx: ToolContext) -> ErrorInfo:
    """The handler's own failure: its details go to the log, the caller gets ``INTERNAL_ERROR``."""
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


def _published(exc: ToolError, defn: ToolDefinition[Any, Any]) -> ErrorInfo:
    info = ErrorInfo.of(exc.code, exc.message, field=exc.field, side_effect=defn.side_effect)
    return info if exc.retryable is None else info.model_copy(update={"retryable": exc.retryable})


def _checked_output(defn: ToolDefinition[Any, Any], result: Any, ctx: ToolContext) -> BaseModel | ErrorInfo:
    model: type[BaseModel] = defn.output_model
    if isinstance(result, model):
        return result
    try:
        return model.model_validate(result)
    except ValidationError as exc:  # its text shows the values, which may echo sensitive arguments: not logged
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(value)'}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False))
        ctx.logger.error("tool %r returned a value that does not fit %s: %s", defn.name, defn.output_model.__name__,
                         problems)
        return ErrorInfo.of(ErrorCode.INTERNAL_ERROR, "the tool returned an invalid result")
