"""One worker of ``server.workers``: a whole sidecar in its own process, started by ``sidecar.server.supervisor``.

    python -m sidecar.cli.serve_worker PARENT_PID STATUS_FD   (its job, a pickled ``WorkerJob``, on stdin)

A fresh interpreter (spawned, never a fork of a process that has started gRPC). First it asks the kernel
for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and exits if the parent is already gone; then it
reads its ``WorkerJob`` from stdin and runs ``sidecar.bootstrap.serve`` with a ``WorkerRole``. On the status
socket ``STATUS_FD`` it writes one JSON line: ``{"addresses": [...]}`` once it serves, or ``{"error": ...,
"exit": N}`` when it cannot start (the exit code ``toolbooth serve`` would have had). Its log lines say
which worker wrote them (``[worker N]`` in text, a ``worker`` field in JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import pickle
import signal
import socket
import sys

from sidecar.cli.common import LOG_FORMAT, setup_logging
from sidecar.cli.preflight import STARTUP_FAILURES, failure_exit
from sidecar.config import LogFormat
from sidecar.server.worker_plan import WorkerJob

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    """Serve as the worker the job on stdin describes, until SIGTERM; the exit code ``toolbooth serve`` has."""
    parent, status_fd = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    job: WorkerJob = pickle.load(sys.stdin.buffer)
    from sidecar.bootstrap import serve  # after the parent check: nothing heavy for an orphan
    from sidecar.server.app import WorkerRole

    setup_logging(job.settings.log_level, job.settings.logging.format)
    _tag_logs(job.index, job.settings.logging.format)
    with socket.socket(fileno=status_fd) as status:
        def tell(message: dict[str, object]) -> None:
            with contextlib.suppress(OSError):  # the supervisor stopped listening: nothing to tell
                status.sendall(json.dumps(message).encode() + b"\n")

        role = WorkerRole(job.index, lambda addresses: tell({"addresses": list(addresses)}))
        try:
            asyncio.run(serve(job.settings, worker=role))
        except STARTUP_FAILURES as exc:
            logging.getLogger(__name__).debug("worker failed", exc_info=True)
            code = failure_exit(exc)
            tell({"error": str(exc), "exit": code})
            return code
        except KeyboardInterrupt:
            return 130
    return 0


def _die_with_parent(parent: int) -> None:
    """SIGTERM (a graceful drain) when the supervisor dies, even by SIGKILL; exit now if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(1)


class _WorkerField(logging.Filter):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


def _tag_logs(index: int, format: LogFormat) -> None:
    """Every log line names the worker: a ``worker`` field (JSON lines), ``[worker N]`` after the logger (text)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_WorkerField(index))
        if format is LogFormat.TEXT:
            handler.setFormatter(logging.Formatter(LOG_FORMAT.replace("%(name)s:", "%(name)s [worker %(worker)s]:")))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
