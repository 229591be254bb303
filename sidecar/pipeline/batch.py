"""The calls of one model reply as a batch: each runs through the chain exactly as ``Pipeline.execute`` runs one.

Every call of a batch is its own ``Call``: resolved, validated, authorized, approved, keyed and audited on
its own, with its own request id. At most ``concurrency`` of them are in the chain at once; they enter it
in request order and their results come back in that order.

With ``cancel_on_permanent_failure``, the first result that is a permanent failure (``permanent``: status
``error``, not retryable) cancels the calls still waiting for their turn and those still running, each
of which gets ``CANCELLED`` (retryable: nothing took effect). A call of a tool with side effects that
has claimed its key is detached from its caller (``call.detached``, the idempotency stage): it is never
cancelled; it finishes, its outcome is stored and audited, and the batch returns its real result. A
running read is cancelled like a unary call whose caller went away (its handler gets ``CancelledError``;
a sync handler's thread finishes in the background). The batch itself being cancelled (its caller went
away) cancels every call as a unary call is cancelled: a detached write runs on by itself, stored and
audited, and the batch does not wait for it.

A cancelled call that had entered the chain is audited by the audit stage (status ``cancelled``); one
that never did is audited here, with the same status, so that every call of a batch has its outcome event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sidecar.config import Limits
from sidecar.contract import CallBatch, CallRequest, ErrorCode, ErrorInfo, Status, ToolResult
from sidecar.errors import InvalidRequestError
from sidecar.pipeline import results
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.stages.audit import Auditor

__all__ = ["EMPTY_BATCH", "checked_calls", "concurrency", "permanent", "run_batch"]

EMPTY_BATCH = "a batch needs at least one call"


def checked_calls(batch: CallBatch, limits: Limits) -> tuple[CallRequest, ...]:
    """The calls of ``batch``, or ``InvalidRequestError`` for none or more than ``limits.max_batch_calls``."""
    if not batch.calls:
        raise InvalidRequestError(EMPTY_BATCH)
    if len(batch.calls) > limits.max_batch_calls:
        raise InvalidRequestError(f"a batch holds at most {limits.max_batch_calls} calls (limits.max_batch_calls), "
                                  f"this one has {len(batch.calls)}")
    return batch.calls


def concurrency(batch: CallBatch, limits: Limits) -> int:
    """How many of the batch's calls run at once: as asked, ``limits.max_batch_concurrency`` for 0, never more."""
    return min(batch.max_concurrency or limits.max_batch_concurrency, limits.max_batch_concurrency)


def permanent(result: ToolResult) -> bool:
    """Whether ``result`` is a permanent failure: an error the caller must not simply retry."""
    return result.status is Status.ERROR and result.error is not None and not result.error.retryable


async def run_batch(calls: Sequence[Call], run: Next, auditor: Auditor, *, concurrency: int,
                    cancel_on_permanent_failure: bool) -> tuple[ToolResult, ...]:
    """Run every call with ``run`` (the chain), at most ``concurrency`` at once; their results in order."""
    turns = asyncio.Semaphore(concurrency)
    entered = [False] * len(calls)
    failed: list[int] = []  # the index of the first permanent failure, once there is one

    async def one(index: int) -> ToolResult:
        async with turns:
            entered[index] = True
            result = await run(calls[index])
            if cancel_on_permanent_failure and not failed and permanent(result):
                failed.append(index)
                _cancel(tasks, calls, but=index)  # before this call's turn passes to a waiting one
            return result

    tasks = [asyncio.create_task(one(index)) for index in range(len(calls))]
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:  # the caller went away: as for a unary call, a detached write runs on by itself
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # each ends at once
        raise
    finally:
        for task, call, went_in in zip(tasks, calls, entered, strict=True):
            if task.cancelled() and not went_in:
                auditor.cancelled(call)
    return tuple(task.result() if not task.cancelled() else _cancelled(call, entered=went_in, failed=failed[0])
                 for task, call, went_in in zip(tasks, calls, entered, strict=True))


def _cancel(tasks: Sequence[asyncio.Task[ToolResult]], calls: Sequence[Call], *, but: int) -> None:
    """Cancel every unfinished call but ``but`` that is not detached: a started write finishes, and the batch
    waits for its result."""
    for index, (task, call) in enumerate(zip(tasks, calls, strict=True)):
        if index != but and not task.done() and not call.detached:
            task.cancel()


def _cancelled(call: Call, *, entered: bool, failed: int) -> ToolResult:
    """The result of a call cancelled because ``calls[failed]`` failed permanently."""
    ran = "was stopped before it ended" if entered else "never started"
    return results.error(call, ErrorInfo.of(ErrorCode.CANCELLED, f"cancelled because calls[{failed}] of the batch "
                                            f"failed permanently (cancel_on_permanent_failure); this call {ran} "
                                            "and changed nothing"))
