"""A worker process: imports its plugin's isolated handlers by path, then runs one request at a time.

The sidecar starts it as ``python -c BOOT FD SYS_PATH`` (a fresh interpreter, never a fork of the
sidecar, whose threads a fork would copy mid-step): the parent's ``sys.path``, then ``main`` on the
socket ``FD``. What the handler returns or raises goes back as a reply (``SystemExit`` too: the
sidecar decides what it means); its log records go to the sidecar's log. The worker ends when the
sidecar closes its end, and by itself if the sidecar dies (its parent changes) even while a handler
runs; SIGINT is ignored (a terminal's ^C reaches the whole process group: the sidecar stops its workers).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback

from sidecar.tools.definition import Handler, ToolContext
from sidecar.tools.isolation.paths import resolve
from sidecar.tools.isolation.protocol import (
    Channel,
    Log,
    Raised,
    Ready,
    Refused,
    Request,
    Returned,
    Start,
    StartFailed,
    encode,
)
from sidecar.tools.outcomes import ToolError

__all__ = ["BOOT", "main"]

BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
        "from sidecar.tools.isolation.worker import main; main(int(sys.argv[1]))")
_ORPHANED_EXIT = 70
_PARENT_CHECK_SECONDS = 0.5


def main(fd: int) -> None:
    """Serve the sidecar at the other end of socket ``fd`` until it closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = Channel(socket.socket(fileno=fd))
    start = channel.receive()
    if not isinstance(start, Start):
        return
    _forward_logs(channel, start.log_level)
    _watch_parent(start.parent_pid)
    try:
        handlers = {tool: resolve(path) for tool, path in start.handlers.items()}
    except BaseException:  # noqa: BLE001 - any failure to import is the answer, SystemExit included
        channel.send(StartFailed(traceback.format_exc()))
        return
    channel.send(Ready(os.getpid()))
    while isinstance(request := channel.receive(), Request):
        reply = _run(handlers[request.tool], request)
        try:
            frame = encode(reply)
        except Exception as exc:  # noqa: BLE001 - whatever pickling the value raised
            frame = encode(Raised(f"its result cannot be sent to the sidecar: {type(exc).__name__}: {exc}"))
        try:
            channel.send_frame(frame)
        except OSError:  # the sidecar went away
            return


def _run(handler: Handler, request: Request) -> Returned | Refused | Raised:
    logger = logging.LoggerAdapter(logging.getLogger(request.logger), dict(request.log_extra))
    ctx = ToolContext(principal=request.principal, request_id=request.request_id,
                      deadline=time.monotonic() + request.remaining, idempotency_key=request.idempotency_key,
                      attempt=request.attempt, logger=logger,
                      approved_preview=None if request.approved_preview is None else dict(request.approved_preview),
                      conversation_id=request.conversation_id, settings=request.settings,
                      declared_labels=request.declared_labels)
    try:
        value = handler(request.args, ctx)
        return Returned(value, frozenset(ctx.labels))
    except ToolError as exc:
        return Refused(exc.code.value, exc.message, exc.field, exc.retryable, exc.safe_details)
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: the worker serves on
        return Raised(f"it raised {type(exc).__name__}:\n{traceback.format_exc()}")


class _Forward(logging.Handler):
    """Sends each record, formatted, to the sidecar, which logs it as its own."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(record.__dict__)
            exc_text = record.exc_text or (logging.Formatter().formatException(record.exc_info)
                                           if record.exc_info else None)
            fields.update(msg=record.getMessage(), args=None, exc_info=None, exc_text=exc_text)
            self._channel.send(Log({name: value for name, value in fields.items()
                                    if value is None or isinstance(value, str | int | float | bool)}))
        except Exception:  # noqa: BLE001 - logging never fails the handler
            self.handleError(record)


def _forward_logs(channel: Channel, level: int) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_Forward(channel)]
    root.setLevel(level)


def _watch_parent(pid: int) -> None:
    """End this process once the sidecar ``pid`` is gone, whatever the handler is doing."""

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(_PARENT_CHECK_SECONDS)
        os._exit(_ORPHANED_EXIT)

    threading.Thread(target=watch, name="toolbooth-parent-watch", daemon=True).start()
