"""MCP over stdin and stdout (``toolbooth mcp-stdio``): one JSON-RPC message a line, and every line answered.

The SDK's ``stdio_server`` hands a line it cannot read to its dispatcher as an exception, which is logged and
dropped, so the client waits forever for an answer; and it decodes stdin with ``errors="replace"``, so a byte
that is not UTF-8 silently becomes U+FFFD inside an argument. ``stdio_streams`` reads bytes: each line is read
by ``sidecar.mcp.envelope`` and either handed to the server or answered at once with its JSON-RPC error (id
null). A line longer than ``max_line_bytes`` is read to its end without being kept and answered
``INVALID_REQUEST``, and so is a request whose id is that of a request still in flight (``7`` and ``"7"`` are
one id; the SDK's dispatcher would run both and answer that id twice): an id is in flight until its answer is
written or the client cancels it (``notifications/cancelled``). While it serves, fd 1 points at stderr and the
protocol goes to a private duplicate of stdout, so stray output of a library cannot break the wire.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from typing import BinaryIO

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp_types import (
    INVALID_REQUEST,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
)

from sidecar.mcp import envelope

__all__ = ["TOO_LARGE", "stdio_streams"]

TOO_LARGE = "Invalid Request: the message is longer than the bridge accepts (--max-message-bytes)"
_CHUNK = 64 * 1024  # an overlong line is skipped this much at a time


@contextlib.asynccontextmanager
async def stdio_streams(*, max_line_bytes: int) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]]:
    """The server's read and write streams over this process's stdin and stdout, until stdin closes."""
    incoming, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, outgoing = anyio.create_memory_object_stream[SessionMessage](0)
    with _claimed_stdout() as stdout:
        wire = _Wire(stdout)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_lines, sys.stdin.buffer, incoming, wire, max_line_bytes)
            tasks.start_soon(_write_all, outgoing, wire)
            yield read, write


class _Wire:
    """Stdout: one message a line, written whole by one writer at a time; and the requests not answered yet."""

    def __init__(self, stdout: BinaryIO) -> None:
        self._stdout, self._lock = stdout, anyio.Lock()
        self.in_flight: set[str] = set()  # the ids of the requests handed to the server, as text

    async def send(self, message: JSONRPCMessage) -> None:
        if isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            self.in_flight.discard(str(message.id))
        line = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
        async with self._lock:
            await anyio.to_thread.run_sync(self._write, line)

    def _write(self, line: bytes) -> None:
        self._stdout.write(line)
        self._stdout.flush()


async def _read_lines(stdin: BinaryIO, incoming: MemoryObjectSendStream[SessionMessage | Exception], wire: _Wire,
                      max_line_bytes: int) -> None:
    """Each line of stdin to the server, or its error back to the client; ends the server's input at EOF."""
    async with incoming:
        while line := await anyio.to_thread.run_sync(stdin.readline, max_line_bytes + 1, abandon_on_cancel=True):
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                await anyio.to_thread.run_sync(_skip_line, stdin, abandon_on_cancel=True)
                await wire.send(envelope.error(INVALID_REQUEST, TOO_LARGE))
                continue
            try:
                message = _admitted(envelope.read(line), wire.in_flight)
            except envelope.Refused as refused:
                await wire.send(refused.error)
                continue
            await incoming.send(SessionMessage(message))


def _admitted(message: JSONRPCMessage, in_flight: set[str]) -> JSONRPCMessage:
    """``message``, its request id now in flight (or a cancelled one no longer); ``Refused`` for an id in flight."""
    if isinstance(message, JSONRPCRequest):
        if str(message.id) in in_flight:
            raise envelope.Refused(INVALID_REQUEST, envelope.DUPLICATE)
        in_flight.add(str(message.id))
    elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
        in_flight.discard(str((message.params or {}).get("requestId")))
    return message


def _skip_line(stdin: BinaryIO) -> None:
    """Read to the end of the current line, keeping nothing."""
    while (chunk := stdin.readline(_CHUNK)) and not chunk.endswith(b"\n"):
        pass


async def _write_all(outgoing: MemoryObjectReceiveStream[SessionMessage], wire: _Wire) -> None:
    async with outgoing:
        async for session_message in outgoing:
            await wire.send(session_message.message)


@contextlib.contextmanager
def _claimed_stdout() -> Iterator[BinaryIO]:
    """A private duplicate of stdout for the protocol, fd 1 pointing at stderr meanwhile (restored after)."""
    sys.stdout.flush()
    wire_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        with os.fdopen(wire_fd, "wb", closefd=False) as wire:
            yield wire
    finally:
        os.dup2(wire_fd, 1)
        os.close(wire_fd)
