"""MCP over stdin and stdout (``toolbooth mcp-stdio``): one JSON-RPC message a line, and every line answered.

The SDK's ``stdio_server`` hands a line it cannot read to its dispatcher as an exception, which is logged and
dropped, so the client waits forever for an answer; and it decodes stdin with ``errors="replace"``, so a byte
that is not UTF-8 silently becomes U+FFFD inside an argument. ``stdio_streams`` reads bytes: each line is read
by ``sidecar.mcp.envelope`` and either handed to the server or answered at once with its JSON-RPC error (id
null). A line longer than ``max_line_bytes`` is read to its end without being kept and answered
``INVALID_REQUEST``, and so is a request whose id is that of a request still in flight (``sidecar.mcp.request_ids``;
the SDK's dispatcher would run both and answer that id twice). One task writes stdout, the server's messages and
these refusals alike, a line at a time. While it serves, fd 0 points at the null device and fd 1 at stderr, and
the protocol goes over private duplicates of both, so a library that reads stdin or writes stdout cannot break
the wire (the SDK's own claim of them, a private function of its pinned version).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from typing import BinaryIO

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _open_stdout_diversion
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, JSONRPCRequest

from sidecar.mcp import envelope
from sidecar.mcp.request_ids import DUPLICATE, InFlightIds

__all__ = ["stdio_streams"]

_TOO_LARGE = "Invalid Request: the message is longer than the bridge accepts (--max-message-bytes)"
_CHUNK = 64 * 1024  # an overlong line is skipped this much at a time


@contextlib.asynccontextmanager
async def stdio_streams(*, max_line_bytes: int) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]]:
    """The server's read and write streams over this process's stdin and stdout, until stdin closes."""
    incoming, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, outgoing = anyio.create_memory_object_stream[SessionMessage](0)
    ids = InFlightIds()
    with _claimed() as (stdin, stdout):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_lines, stdin, incoming, write.clone(), ids, max_line_bytes)
            tasks.start_soon(_write_all, outgoing, stdout, ids)
            yield read, write


async def _read_lines(stdin: BinaryIO, incoming: MemoryObjectSendStream[SessionMessage | Exception],
                      refusals: MemoryObjectSendStream[SessionMessage], ids: InFlightIds, max_line_bytes: int) -> None:
    """Each line of stdin to the server, or its error back to the client; ends the server's input at EOF."""
    async with incoming, refusals:
        while line := await anyio.to_thread.run_sync(stdin.readline, max_line_bytes + 1, abandon_on_cancel=True):
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                await anyio.to_thread.run_sync(_skip_line, stdin, abandon_on_cancel=True)
                await refusals.send(SessionMessage(envelope.error(INVALID_REQUEST, _TOO_LARGE)))
                continue
            try:
                message = envelope.read(line)
            except envelope.Refused as refused:
                await refusals.send(SessionMessage(refused.error))
                continue
            request_id = message.id if isinstance(message, JSONRPCRequest) else None
            if request_id is not None and not ids.claim(request_id):
                await refusals.send(SessionMessage(envelope.error(INVALID_REQUEST, DUPLICATE)))
                continue
            item = SessionMessage(message)
            ids.handed_over(item)
            if request_id is not None:
                ids.release(request_id)  # in flight until answered: the line is done with
            await incoming.send(item)


def _skip_line(stdin: BinaryIO) -> None:
    """Read to the end of the current line, keeping nothing."""
    while (chunk := stdin.readline(_CHUNK)) and not chunk.endswith(b"\n"):
        pass


async def _write_all(outgoing: MemoryObjectReceiveStream[SessionMessage], stdout: BinaryIO, ids: InFlightIds) -> None:
    """Each message, the server's and the refusals, to stdout: one line each, written by this one writer."""
    async with outgoing:
        async for item in outgoing:
            ids.answered(item)
            line = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
            await anyio.to_thread.run_sync(_write_line, stdout, line)


def _write_line(stdout: BinaryIO, line: bytes) -> None:
    stdout.write(line)
    stdout.flush()


@contextlib.contextmanager
def _claimed() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """Private duplicates of stdin and stdout for the protocol, fd 0 pointing at the null device and fd 1 at
    stderr meanwhile (restored after): the SDK's own claim of the standard streams, as its ``stdio_server``."""
    sys.stdout.flush()
    stdin, release_stdin = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
    try:
        stdout, release_stdout = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
        try:
            yield stdin, stdout
        finally:
            if release_stdout is not None:
                release_stdout()
    finally:
        if release_stdin is not None:
            release_stdin()
