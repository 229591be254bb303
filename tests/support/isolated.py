"""Sync tools for process isolation (``isolation`` in the config): each runs in a worker process.

A worker shares no memory with the test, so these tools leave their traces in files of the
directory ``args.dir``: ``<name>.pid`` (written once the handler runs: the worker's pid) and
``<name>.runs`` (one line per execution). ``gate`` opens when the test creates ``<dir>/gate``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sidecar.contract import ErrorCode
from sidecar.plugin import Partial, SideEffect, ToolContext, ToolError, tool

TIMEOUT = 0.5  # seconds: the runaway tools' timeout


class JobSettings(BaseModel):
    """The settings a test may give these tools as their plugin's (``Plugin(ALL, settings=JobSettings)``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str = "default"


class Job(BaseModel):
    dir: str
    name: str = "job"


class Ran(BaseModel):
    """What the handler saw: its process, and its context."""

    pid: int
    principal: str
    tenant: str
    request_id: str
    idempotency_key: str | None
    attempt: int
    remaining: float
    conversation_id: str | None = None
    label: str | None = None  # ``JobSettings.label`` of the context's settings, if it holds them


def ran(args: Job, ctx: ToolContext) -> Ran:
    return Ran(pid=os.getpid(), principal=ctx.principal.id, tenant=ctx.principal.tenant, request_id=ctx.request_id,
               idempotency_key=ctx.idempotency_key, attempt=ctx.attempt, remaining=ctx.time_remaining(),
               conversation_id=ctx.conversation_id,
               label=ctx.settings.label if isinstance(ctx.settings, JobSettings) else None)


def started(args: Job) -> None:
    """Leave ``<name>.pid`` (written whole, then renamed: a reader never sees half of it) and a line in
    ``<name>.runs``."""
    folder = Path(args.dir)
    with (folder / f"{args.name}.runs").open("a") as runs:
        runs.write(f"{os.getpid()}\n")
    partial = folder / f"{args.name}.pid.partial"
    partial.write_text(str(os.getpid()))
    partial.rename(folder / f"{args.name}.pid")


@tool(name="whoami", version="1.0.0", side_effect=SideEffect.NONE, timeout=5)
def whoami(args: Job, ctx: ToolContext) -> Ran:
    """Return the worker's pid and what the context held."""
    ctx.logger.warning("whoami ran in process %d", os.getpid())
    return ran(args, ctx)


@tool(name="spin", version="1.0.0", side_effect=SideEffect.NONE, timeout=TIMEOUT)
def spin(args: Job, ctx: ToolContext) -> Ran:
    """A runaway: loops forever."""
    started(args)
    while True:
        pass


@tool(name="spin_stubborn", version="1.0.0", side_effect=SideEffect.NONE, timeout=TIMEOUT)
def spin_stubborn(args: Job, ctx: ToolContext) -> Ran:
    """A runaway that ignores SIGTERM: only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    started(args)
    while True:
        pass


@tool(name="spin_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=TIMEOUT)
def spin_note(args: Job, ctx: ToolContext) -> Ran:
    """A runaway write: its effect (the line in ``<name>.runs``) happened; it never returns."""
    started(args)
    while True:
        pass


@tool(name="gated", version="1.0.0", side_effect=SideEffect.NONE, timeout=20)
def gated(args: Job, ctx: ToolContext) -> Ran:
    """Runs until the test creates ``<dir>/gate`` (within its deadline), then returns."""
    started(args)
    gate = Path(args.dir) / "gate"
    while not gate.exists():
        if ctx.time_remaining() <= 0:
            raise ToolError(ErrorCode.TIMEOUT, "the gate never opened")
        time.sleep(0.005)
    return ran(args, ctx)


@tool(name="exit_now", version="1.0.0", side_effect=SideEffect.NONE)
def exit_now(args: Job, ctx: ToolContext) -> Ran:
    """Ends its process at once, past every ``finally``."""
    started(args)
    os._exit(3)


@tool(name="exit_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
def exit_note(args: Job, ctx: ToolContext) -> Ran:
    """A write that has its effect (the line in ``<name>.runs``), then ends its process before it answers."""
    started(args)
    os._exit(1)


@tool(name="crash_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
def crash_note(args: Job, ctx: ToolContext) -> Ran:
    """A write that has its effect, then dies of a signal before it answers."""
    started(args)
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("not reached")


@tool(name="raise_exit", version="1.0.0", side_effect=SideEffect.NONE)
def raise_exit(args: Job, ctx: ToolContext) -> Ran:
    """Raises ``SystemExit``."""
    started(args)
    raise SystemExit(2)


@tool(name="crash", version="1.0.0", side_effect=SideEffect.NONE)
def crash(args: Job, ctx: ToolContext) -> Ran:
    """Dies of a signal, as a segfault in an extension would."""
    started(args)
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("not reached")


@tool(name="refuse", version="1.0.0", side_effect=SideEffect.NONE)
def refuse(args: Job, ctx: ToolContext) -> Ran:
    """Raises a published ``ToolError``."""
    raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, f"no job named {args.name!r}", field="name", retryable=False,
                    safe_details={"known_jobs": ["job"]})


@tool(name="partly", version="1.0.0", side_effect=SideEffect.NONE)
def partly(args: Job, ctx: ToolContext) -> Ran | Partial[Ran]:
    """Returns a partial result: its output and its failed parts cross back from the worker."""
    return Partial(ran(args, ctx), errors=[ToolError(ErrorCode.PARTIAL_DELIVERY, "one part failed",
                                                     safe_details={"part": 2})])


@tool(name="wrong_output", version="1.0.0", side_effect=SideEffect.NONE)
def wrong_output(args: Job, ctx: ToolContext) -> Ran:
    """Returns a dict that does not fit its output model."""
    return {"pid": "not a number"}  # type: ignore[return-value]


@tool(name="unpicklable", version="1.0.0", side_effect=SideEffect.NONE)
def unpicklable(args: Job, ctx: ToolContext) -> Ran:
    """Returns a value that cannot cross back to the sidecar."""
    return lambda: None  # type: ignore[return-value]


@tool(name="async_job", version="1.0.0", side_effect=SideEffect.NONE)
async def async_job(args: Job, ctx: ToolContext) -> Ran:
    """An async tool: never isolated."""
    await asyncio.sleep(0)
    return ran(args, ctx)


SYNC = [whoami, spin, spin_stubborn, spin_note, gated, exit_now, exit_note, crash_note, raise_exit, crash, refuse,
        partly, wrong_output, unpicklable]
ALL = [*SYNC, async_job]
