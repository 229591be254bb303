"""Tools used by the tests: each shows one behaviour of the pipeline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from sidecar.contract import ErrorCode
from sidecar.plugin import RetryPolicy, SideEffect, ToolContext, ToolError, tool
from tests.support.waiting import until


class Text(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=10_000)


class Nested(BaseModel):
    payload: dict[str, object] = {}


class Count(BaseModel):
    count: int = Field(ge=0)


class Echoed(BaseModel):
    text: str
    principal: str
    attempt: int = 1


class Counter:
    """Thread-safe invocation counter shared by a test and a tool."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def bump(self) -> int:
        with self._lock:
            self.value += 1
            return self.value

    async def reached(self, value: int, *, timeout: float = 5.0) -> None:
        """Wait until the counter is at least ``value`` (``AssertionError`` after ``timeout`` seconds)."""
        await until(lambda: self.value >= value, timeout=timeout, what=f"the counter reaching {value}")


class Gate:
    """Holds handlers until a test opens it (a thread-safe flag, so sync handlers can wait on it too)."""

    def __init__(self) -> None:
        self._open = threading.Event()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    async def passed(self) -> None:
        """Return once the gate is open (within the handler's own deadline, at most 60 s)."""
        await until(self._open.is_set, timeout=60, what="the gate opening")


@tool(name="echo", version="1.0.0", side_effect=SideEffect.NONE, timeout=2)
async def echo(args: Text, ctx: ToolContext) -> Echoed:
    """Return the text and who asked."""
    return Echoed(text=args.text, principal=ctx.principal.id, attempt=ctx.attempt)


@tool(name="echo_sync", version="1.0.0", side_effect=SideEffect.NONE, timeout=2)
def echo_sync(args: Text, ctx: ToolContext) -> Echoed:
    """A sync handler: runs in the thread pool."""
    return Echoed(text=args.text, principal=ctx.principal.id)


@tool(name="nested", version="1.0.0", side_effect=SideEffect.NONE)
async def nested(args: Nested, ctx: ToolContext) -> Nested:
    """Accept any object; used for size and depth limits."""
    return args


@tool(name="boom", version="1.0.0", side_effect=SideEffect.NONE)
async def boom(args: Text, ctx: ToolContext) -> Echoed:
    """Fail with an unexpected exception whose text must never reach the caller."""
    raise RuntimeError("secret-db-password=hunter2")


@tool(name="not_found", version="1.0.0", side_effect=SideEffect.NONE)
async def not_found(args: Text, ctx: ToolContext) -> Echoed:
    """Fail with a published ToolError."""
    raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, f"no document named {args.text!r}", field="text")


SLOW_STARTED, SLOW_CANCELLED = Counter(), Counter()


@tool(name="slow", version="1.0.0", side_effect=SideEffect.NONE, timeout=0.2)
async def slow(args: Count, ctx: ToolContext) -> Count:
    """Sleep ``count`` milliseconds (timeout 200 ms); count starts and cancellations."""
    SLOW_STARTED.bump()
    try:
        await asyncio.sleep(args.count / 1000)
    except asyncio.CancelledError:
        SLOW_CANCELLED.bump()
        raise
    return args


@tool(name="big", version="1.0.0", side_effect=SideEffect.NONE)
async def big(args: Count, ctx: ToolContext) -> Text:
    """Return ``count`` characters: above the result limit, an error."""
    return Text.model_construct(text="x" * args.count)


@tool(name="own_timeout", version="1.0.0", side_effect=SideEffect.NONE, timeout=5,
      retry=RetryPolicy(max_attempts=3, initial_backoff=0.001))
async def own_timeout(args: Text, ctx: ToolContext) -> Text:
    """A backend of the tool times out (its own TimeoutError), long before the tool's deadline."""
    raise TimeoutError("backend read timed out")


@tool(name="bad_output", version="1.0.0", side_effect=SideEffect.NONE)
async def bad_output(args: Text, ctx: ToolContext) -> Count:
    """Returns something that does not fit its output model."""
    return {"count": "many"}  # type: ignore[return-value]


FLAKY = Counter()


@tool(name="flaky", version="1.0.0", side_effect=SideEffect.NONE,
      retry=RetryPolicy(max_attempts=3, initial_backoff=0.001))
async def flaky(args: Count, ctx: ToolContext) -> Count:
    """Fail retryably until attempt ``count``."""
    FLAKY.bump()
    if ctx.attempt < args.count:
        raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, "backend busy")
    return Count(count=ctx.attempt)


CREATED = Counter()


@tool(name="create_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=2)
async def create_note(args: Text, ctx: ToolContext) -> Count:
    """A write tool: counts real executions, slowly enough for duplicates to overlap."""
    number = CREATED.bump()
    await asyncio.sleep(0.05)
    return Count(count=number)


HELD_STARTED, HELD_DONE, HOLD = Counter(), Counter(), Gate()


@tool(name="held_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5)
async def held_note(args: Text, ctx: ToolContext) -> Count:
    """A write tool that runs until the test opens ``HOLD``: a test sees the call in flight for sure."""
    HELD_STARTED.bump()
    await HOLD.passed()
    return Count(count=HELD_DONE.bump())


SLEPT = Counter()


@tool(name="sleepy_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=10)
async def sleepy_note(args: Count, ctx: ToolContext) -> Count:
    """A write that takes ``args.count`` ms (longer than its caller waits, in the deadline tests); its output is
    its number among the executions that ran to their end (``SLEPT``)."""
    await asyncio.sleep(args.count / 1000)
    return Count(count=SLEPT.bump())


class Note(BaseModel):
    title: str
    body: str


@tool(name="file_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
async def file_note(args: Note, ctx: ToolContext) -> Count:
    """A write tool with two fields: key order must not matter to idempotency."""
    return Count(count=CREATED.bump())


@tool(name="send_email", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE,
      permissions=("email:send",))
async def send_email(args: Text, ctx: ToolContext) -> Count:
    """Irreversible: the default approval policy requires a person's approval."""
    raise AssertionError("must never run without approval")


@tool(name="admin_console", version="1.0.0", side_effect=SideEffect.NONE)
async def admin_console(args: Text, ctx: ToolContext) -> Text:
    """Hidden from non-admins by the default availability policy."""
    return args


@tool(name="delete_records", version="1.0.0", side_effect=SideEffect.NONE, permissions=("records:delete",))
async def delete_records(args: Text, ctx: ToolContext) -> Text:
    """Needs a permission the default developer principal lacks."""
    return args


class Tickets:
    """Lets held handlers go one by one: a handler waits in ``take(name)`` until the test ``release``s that name;
    ``started``, ``running``, ``cancelled`` and ``most`` (the most running at once) say what the handlers did.
    Thread-safe, like ``Counter``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._released: set[str] = set()
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.running = self.most = 0

    def release(self, *names: str) -> None:
        with self._lock:
            self._released.update(names)

    def reset(self) -> None:
        with self._lock:
            self._released.clear()
            self.started.clear()
            self.cancelled.clear()
            self.running = self.most = 0

    async def take(self, name: str) -> None:
        """Wait (as a running handler) until ``name`` is released; a cancellation is noted, then passed on."""
        with self._lock:
            self.started.append(name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            await until(lambda: name in self._released, timeout=60, what=f"the release of {name!r}")
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        finally:
            with self._lock:
                self.running -= 1

    async def seen(self, condition: Callable[[Tickets], bool], what: str) -> None:
        """Wait until ``condition(self)`` holds."""
        await until(lambda: condition(self), timeout=10, what=what)


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    fail: bool = False


TICKETS = Tickets()


@tool(name="turn", version="1.0.0", side_effect=SideEffect.NONE, timeout=10)
async def turn(args: Turn, ctx: ToolContext) -> Text:
    """A read that reports it started, runs until the test releases its ``name`` (``TICKETS``), then returns the
    name or, with ``fail``, fails permanently (``RESOURCE_NOT_FOUND``)."""
    await ctx.report_progress(0, message=f"{args.name} started")
    await TICKETS.take(args.name)
    if args.fail:
        raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, f"no turn named {args.name!r}")
    return Text(text=args.name)


@tool(name="count_up", version="1.0.0", side_effect=SideEffect.NONE, timeout=10)
async def count_up(args: Count, ctx: ToolContext) -> Count:
    """Report progress 1..count of count, letting the event loop run between two reports."""
    for done in range(1, args.count + 1):
        await ctx.report_progress(done, total=args.count, message=f"{done} of {args.count}")
        await asyncio.sleep(0)
    return args


@tool(name="count_up_sync", version="1.0.0", side_effect=SideEffect.NONE, timeout=10)
def count_up_sync(args: Count, ctx: ToolContext) -> Count:
    """``count_up`` as a sync handler: reports from its worker thread, without a total."""
    for done in range(1, args.count + 1):
        ctx.report_progress_sync(done)
    return args


BATCH_AND_STREAM = [held_note, sleepy_note, turn, count_up, count_up_sync]  # with ALL: batch, stream, deadline tests

ALL = [echo, echo_sync, nested, boom, not_found, slow, big, flaky, own_timeout, bad_output, create_note, file_note,
       send_email, admin_console, delete_records]
