"""What the sidecar and a worker process say to each other over their socket pair, and how it is framed.

A frame is an 8-byte big-endian length and a pickle. The sidecar sends ``Start`` once, then one
``Request`` at a time; the worker answers ``Ready`` (or ``StartFailed``) once, then one reply per
request: ``Returned`` (the handler's value, checked against the output model by the sidecar),
``Refused`` (a ``ToolError``, field by field: an exception with keyword arguments does not pickle)
or ``Raised`` (anything else the handler raised, or a value that does not pickle, as text for the
log). ``Log`` frames, the worker's log records, may come at any time. Only the picklable parts of
a ``ToolContext`` cross: its logger is rebuilt in the worker from its name and extra fields, its
deadline from the time remaining.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sidecar.contract import Principal
from sidecar.tools.isolation.paths import HandlerPath

__all__ = ["MAX_FRAME", "Channel", "Log", "Raised", "Ready", "Refused", "Request", "Returned", "Start",
           "StartFailed", "encode", "read_frame"]

_HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 30  # bytes: a longer frame is a broken channel


@dataclass(frozen=True)
class Start:
    """The worker's one job: the handlers of ``plugin`` it imports; its log level; the sidecar's pid."""

    plugin: str
    handlers: Mapping[str, HandlerPath]
    log_level: int
    parent_pid: int


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class StartFailed:
    reason: str


@dataclass(frozen=True)
class Request:
    """One call of ``tool``: its validated arguments and its context (``remaining``: seconds to the deadline)."""

    tool: str
    args: BaseModel
    principal: Principal
    request_id: str
    remaining: float
    idempotency_key: str | None
    attempt: int
    logger: str
    log_extra: Mapping[str, Any]
    approved_preview: Mapping[str, Any] | None = None
    conversation_id: str | None = None
    settings: BaseModel | None = None  # the plugin's settings, as the handler's context holds them
    declared_labels: frozenset[str] = frozenset()  # the labels the tool declares


@dataclass(frozen=True)
class Returned:
    value: Any
    labels: frozenset[str] = frozenset()  # those the handler added to its result (``ToolContext.add_label``)


@dataclass(frozen=True)
class Refused:
    code: str
    message: str
    field: str | None
    retryable: bool | None
    safe_details: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Raised:
    """What went wrong, for the log: the handler's exception and its traceback, or a result that does not pickle."""

    description: str


@dataclass(frozen=True)
class Log:
    record: Mapping[str, Any]


def encode(message: object) -> bytes:
    """One frame; whatever ``pickle`` raises for a message that does not pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's pickle; ``asyncio.IncompleteReadError`` at the end of the stream, ``ValueError`` for a
    frame too long to be one."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes")
    return await reader.readexactly(size)


class Channel:
    """The worker's end: blocking, one message at a time each way (sends from any thread)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self._lock = sock, threading.Lock()

    def send(self, message: object) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        with self._lock:
            self._sock.sendall(frame)

    def receive(self) -> object | None:
        """The next message, ``None`` once the sidecar closed its end."""
        header = self._exactly(_HEADER.size)
        if header is None:
            return None
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            raise ValueError(f"a frame of {size} bytes")
        data = self._exactly(size)
        return None if data is None else pickle.loads(data)

    def _exactly(self, size: int) -> bytes | None:
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
