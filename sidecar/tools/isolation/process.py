"""One worker process, seen from the sidecar: started, asked one call at a time, stopped.

A reader task takes every frame the worker sends: log records are logged as the sidecar's own,
the rest answer the one pending start-up or call. When the worker's end closes (it exited, it was
killed) the pending call fails with ``WorkerLost`` and the pool is told (``on_end``). ``WorkerLost``
says whether the call had reached the worker (``delivered``: its handler may have run, whatever ended
the process) or provably not (the worker had ended before the request was written whole). A call
interrupted before its reply (its deadline passed, it was cancelled) leaves the worker ``spoiled``:
it may still be running the handler, so its pool stops it rather than use it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from sidecar.errors import PluginLoadError
from sidecar.tools.definition import ToolContext
from sidecar.tools.isolation.paths import HandlerPath
from sidecar.tools.isolation.protocol import (
    Log,
    Raised,
    Ready,
    Refused,
    Request,
    Returned,
    Start,
    StartFailed,
    encode,
    read_frame,
)
from sidecar.tools.isolation.worker import BOOT
from sidecar.tools.outcomes import ToolError

__all__ = ["HandlerFailed", "Worker", "WorkerLost", "exit_reason"]

log = logging.getLogger("toolbooth.isolation")

_REAP_SECONDS = 5.0  # after SIGKILL: a process that is still not gone is reported, not waited for


class HandlerFailed(Exception):
    """The handler failed in its worker process: it raised something other than ``ToolError``, or its answer
    cannot be read. The message is for the sidecar's log, never for the caller."""


class WorkerLost(HandlerFailed):
    """The worker process ended before it answered. ``delivered``: the request had reached it, so the handler
    may have run (and had its effect); otherwise nothing ran. The message is for the sidecar's log."""

    def __init__(self, message: str, *, delivered: bool) -> None:
        super().__init__(message)
        self.delivered = delivered


class Worker:
    """A worker process of plugin ``plugin`` and the sidecar's end of its socket."""

    def __init__(self, plugin: str, process: asyncio.subprocess.Process, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, on_end: Callable[[Worker], None]) -> None:
        self.plugin, self.pid = plugin, process.pid
        self.alive, self.spoiled = True, False
        self.stopped = asyncio.Event()  # set once the process is gone and its socket closed
        self._process, self._writer, self._on_end = process, writer, on_end
        self._pending: asyncio.Future[object] | None = None
        self._reading = asyncio.create_task(self._read(reader))

    @classmethod
    async def spawn(cls, plugin: str, handlers: Mapping[str, HandlerPath], *, on_end: Callable[[Worker], None],
                    timeout: float) -> Worker:
        """A new worker that imported ``handlers``; ``PluginLoadError`` if it cannot within ``timeout``."""
        ours, theirs = socket.socketpair()
        path = json.dumps([entry for entry in sys.path if isinstance(entry, str)])
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", BOOT, str(theirs.fileno()), path, pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        worker = cls(plugin, process, reader, writer, on_end)
        start = Start(plugin, dict(handlers), logging.getLogger().getEffectiveLevel(), os.getpid())
        try:
            async with asyncio.timeout(timeout):
                answer = await worker._ask(encode(start))
        except BaseException as exc:
            await asyncio.shield(worker.stop(0))
            if isinstance(exc, WorkerLost):
                raise PluginLoadError(f"a worker process of plugin {plugin!r} ended before it was ready "
                                      f"({exit_reason(worker._process.returncode)})") from None
            if isinstance(exc, TimeoutError):
                raise PluginLoadError(f"a worker process of plugin {plugin!r} was not ready within "
                                      f"{timeout:.0f} s") from None
            raise
        if not isinstance(answer, Ready):
            await asyncio.shield(worker.stop(0))
            reason = answer.reason.rstrip() if isinstance(answer, StartFailed) else repr(answer)
            raise PluginLoadError(f"a worker process of plugin {plugin!r} cannot import its isolated handlers:\n"
                                  f"{reason}")
        return worker

    async def call(self, tool: str, args: BaseModel, ctx: ToolContext) -> Any:
        """Run ``tool``'s handler in the worker: what it returned; ``ToolError``, ``HandlerFailed`` or
        ``WorkerLost``."""
        request = Request(tool, args, ctx.principal, ctx.request_id, ctx.time_remaining(), ctx.idempotency_key,
                          ctx.attempt, ctx.logger.logger.name, dict(ctx.logger.extra or {}), ctx.approved_preview,
                          ctx.conversation_id, ctx.settings, ctx.declared_labels)
        frame = encode(request)  # one that does not pickle fails here, before the worker sees anything
        try:
            reply = await self._ask(frame)
        except BaseException:
            self.spoiled = True  # the handler may still run: never ask this worker again
            raise
        if isinstance(reply, Returned):
            ctx.labels.update(reply.labels)
            return reply.value
        if isinstance(reply, Refused):
            raise ToolError(reply.code, reply.message, field=reply.field, retryable=reply.retryable,
                            safe_details=None if reply.safe_details is None else dict(reply.safe_details))
        if isinstance(reply, Raised):
            raise HandlerFailed(f"in worker process {self.pid}, {reply.description.rstrip()}")
        raise HandlerFailed(f"worker process {self.pid} answered {type(reply).__name__}")

    async def stop(self, grace: float, *, ask: bool = False) -> int | None:
        """End the process: close its socket (``ask``: it may exit by itself) or send SIGTERM, SIGKILL after
        ``grace`` seconds; its exit code (``None`` if it would not end)."""
        try:
            if self._process.returncode is None:
                if ask:
                    self._writer.close()
                elif not self._reading.done():  # else its end closed: it is exiting, or has exited
                    self._signal(signal.SIGTERM)
                if not await _ended(self._process, grace):
                    self._signal(signal.SIGKILL)
                    if not await _ended(self._process, _REAP_SECONDS):
                        log.error("worker process %d of plugin %r did not end after SIGKILL", self.pid, self.plugin)
            self._writer.close()
            await self._reading
            return self._process.returncode
        finally:
            self.alive = False
            self.stopped.set()

    def _signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the process, which has not been reaped (``os.kill``: ``Popen.send_signal`` would
        reap an exited one itself, and the exit code would be lost to asyncio)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    async def _ask(self, frame: bytes) -> object:
        """The worker's answer to ``frame``; ``WorkerLost`` if it ends first (not ``delivered`` if the frame
        never reached it whole: the worker had ended before it was written)."""
        if not self.alive:
            raise WorkerLost(f"worker process {self.pid} had ended before the call", delivered=False)
        self._pending = pending = asyncio.get_running_loop().create_future()
        try:
            try:
                self._writer.write(frame)
                await self._writer.drain()
            except ConnectionError:
                raise WorkerLost(f"worker process {self.pid} had ended before the call", delivered=False) from None
            return await pending
        finally:
            self._pending = None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await read_frame(reader)
                try:
                    message = pickle.loads(data)
                except Exception as exc:  # noqa: BLE001 - whatever unpickling raised: that reply is unreadable
                    message = Raised(f"its reply cannot be read: {type(exc).__name__}: {exc}")
                if isinstance(message, Log):
                    _emit(message.record)
                elif self._pending is not None and not self._pending.done():
                    self._pending.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass  # the worker's end closed (it exited or was killed), or it sent no frame
        finally:
            self.alive = False
            if self._pending is not None and not self._pending.done():
                self._pending.set_exception(WorkerLost(f"worker process {self.pid} ended while it ran",
                                                       delivered=True))
            self._on_end(self)


def exit_reason(code: int | None) -> str:
    """How a process ended, for the log."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


async def _ended(process: asyncio.subprocess.Process, within: float) -> bool:
    """Whether ``process`` ends within ``within`` seconds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await process.wait()
    return process.returncode is not None


def _emit(fields: Mapping[str, Any]) -> None:
    """Log a worker's record as if it were the sidecar's own (its ``process`` is the worker's pid)."""
    record = logging.makeLogRecord(dict(fields))
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)
