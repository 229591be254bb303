"""``server.workers: N`` above 1: a supervisor process running N whole sidecars (``sidecar.cli.serve_worker``).

``workers: auto`` was counted when the settings loaded (``sidecar.config.cpus``); the supervisor logs from what.

``supervise`` holds the TCP ports (``sidecar.server.worker_plan``), then starts every worker (a spawned
interpreter in a process group of its own, sent its settings on stdin) and waits until each serves:

- **Start-up.** A worker that cannot start (a plugin, the store, a port) stops the others, and
  ``supervise`` raises ``WorkerFailed`` with that worker's error and its exit code (1, or 2 for a wrong
  configuration or file), as one ``toolbooth serve`` would have failed.
- **SIGTERM / SIGINT.** Forwarded as SIGTERM to every worker: each drains as one sidecar does (health
  NOT_SERVING, in-flight calls get ``server.shutdown_grace_seconds``, writes are recorded); one still
  running ``_STOP_MARGIN_SECONDS`` after that grace is killed. The exit code is 0 when every worker
  stopped cleanly, else 1.
- **A worker that dies** (a crash, SIGKILL, the OOM killer) is restarted after a wait that doubles from
  ``_FIRST_RESTART_SECONDS`` up to ``_LONGEST_RESTART_SECONDS``, each death logged with how it ended. The
  others serve meanwhile: the kernel sends new connections only to listening workers. More than
  ``_CRASHES_ALLOWED`` deaths (or failed restarts) within ``_CRASH_WINDOW_SECONDS`` is a crash loop: every
  worker is stopped and ``supervise`` raises ``WorkerFailed`` (exit 1).
- **If the supervisor dies** (even by SIGKILL) every worker gets SIGTERM from the kernel
  (``PR_SET_PDEATHSIG``) and drains.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable

from sidecar.config import Settings
from sidecar.server.worker_plan import WorkerJob, WorkerPlan

__all__ = ["WorkerFailed", "supervise"]

log = logging.getLogger(__name__)

_FIRST_RESTART_SECONDS = 0.5
_LONGEST_RESTART_SECONDS = 10.0
_CRASHES_ALLOWED = 5
_CRASH_WINDOW_SECONDS = 60.0
_STOP_MARGIN_SECONDS = 15.0  # beyond the drain's grace: the store closing, the last writes, the checkpoint


class WorkerFailed(Exception):
    """A worker could not start, or they crash in a loop: the sidecar stops with ``exit_code``."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Worker:
    """Worker ``index``: its current process, started again after it ends."""

    def __init__(self, index: int, settings: Settings) -> None:
        self.index, self.settings = index, settings
        self.process: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> tuple[str, ...]:
        """A new process of this worker, returned once it serves (its addresses as bound); ``WorkerFailed``
        with its error if it ends first."""
        ours, theirs = socket.socketpair()
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sidecar.cli.serve_worker", str(os.getpid()), str(theirs.fileno()),
                stdin=subprocess.PIPE, pass_fds=(theirs.fileno(),), process_group=0)
        finally:
            theirs.close()
        with ours:
            assert self.process.stdin is not None
            self.process.stdin.write(pickle.dumps(WorkerJob(self.index, self.settings)))
            with contextlib.suppress(ConnectionError):
                await self.process.stdin.drain()
            self.process.stdin.close()
            reader, writer = await asyncio.open_connection(sock=ours)
            try:
                line = await reader.readline()
            finally:
                writer.close()
        status = json.loads(line) if line else {}
        if "addresses" in status:
            log.info("worker %d serving: pid %d", self.index, self.process.pid,
                     extra={"worker": self.index, "worker_pid": self.process.pid})
            return tuple(status["addresses"])
        code = await self.process.wait()
        if "error" in status:
            raise WorkerFailed(f"worker {self.index}: {status['error']}", int(status["exit"]))
        raise WorkerFailed(f"worker {self.index} (pid {self.process.pid}) {_ended(code)} before serving", 1)

    async def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after ``grace``; the exit code (0 if it was not running)."""
        process = self.process
        if process is None:
            return 0
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                log.error("worker %d (pid %d) still running %.0f s after SIGTERM: killed", self.index, process.pid,
                          grace)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        return process.returncode or 0


class _CrashCount:
    """The recent deaths of all workers; too many within the window is a crash loop."""

    def __init__(self) -> None:
        self._times: collections.deque[float] = collections.deque()

    def record(self) -> float:
        """Count one death; the wait before its restart (``WorkerFailed`` in a crash loop)."""
        now = time.monotonic()
        self._times.append(now)
        while self._times[0] < now - _CRASH_WINDOW_SECONDS:
            self._times.popleft()
        if len(self._times) > _CRASHES_ALLOWED:
            raise WorkerFailed(f"workers died {len(self._times)} times within {_CRASH_WINDOW_SECONDS:.0f} s: "
                               "stopping instead of restarting them again (see the log for how each ended)", 1)
        return min(_FIRST_RESTART_SECONDS * 2.0 ** (len(self._times) - 1), _LONGEST_RESTART_SECONDS)


async def supervise(settings: Settings) -> int:
    """Run ``server.workers`` workers until SIGTERM/SIGINT; the exit code. ``WorkerFailed`` when one cannot
    start or they crash in a loop, ``OSError`` when a port cannot be held."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, _on_signal, number, stop)
    if (auto := settings.server.workers_auto) is not None:
        log.info("server.workers: auto: %d workers, for %s", settings.server.workers, auto.source,
                 extra={"workers": settings.server.workers, "workers_source": auto.source})
    plan = WorkerPlan.reserve(settings)
    workers = [_Worker(index, plan.settings_for(index)) for index in range(settings.server.workers)]
    grace = settings.server.shutdown_grace_seconds + _STOP_MARGIN_SECONDS
    try:
        if not await _until_stopped(_start_all(workers, settings), stop):
            return await _stop_all(workers, grace)
        crashes = _CrashCount()
        keepers = [asyncio.create_task(_keep(worker, crashes, stop)) for worker in workers]
        try:
            await _until_stopped(asyncio.gather(*keepers), stop)  # raises a crash loop
        finally:
            for keeper in keepers:
                keeper.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            code = await _stop_all(workers, grace)
        return code
    finally:
        plan.close()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(number)


async def _start_all(workers: list[_Worker], settings: Settings) -> None:
    """Start every worker; the first one failing stops the others and is raised."""
    try:
        bound = await asyncio.gather(*(worker.start() for worker in workers))
    except BaseException:
        await _stop_all(workers, settings.server.shutdown_grace_seconds + _STOP_MARGIN_SECONDS)
        raise
    pids = [worker.process.pid for worker in workers if worker.process is not None]
    log.info("toolbooth serving with %d workers (pids %s) on %s", len(workers), ", ".join(map(str, pids)),
             ", ".join(bound[0]), extra={"worker_pids": pids, "listeners": list(bound[0])})


async def _keep(worker: _Worker, crashes: _CrashCount, stop: asyncio.Event) -> None:
    """Restart ``worker`` whenever it ends, after the wait ``crashes`` says; raise its crash loop."""
    while True:
        assert worker.process is not None
        code = await worker.process.wait()
        if stop.is_set():
            return
        delay = crashes.record()
        log.error("worker %d (pid %d) %s; restarting it in %.1f s", worker.index, worker.process.pid, _ended(code),
                  delay)
        if not await _until_stopped(asyncio.sleep(delay), stop):
            return
        try:
            await worker.start()
        except WorkerFailed as exc:
            log.error("restarting worker %d failed: %s", worker.index, exc)


async def _until_stopped(work: Awaitable[object], stop: asyncio.Event) -> bool:
    """Await ``work`` unless ``stop`` is set first (``work`` is then cancelled); whether it finished."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


async def _stop_all(workers: list[_Worker], grace: float) -> int:
    """SIGTERM every worker at once and wait for them; 0 when each stopped cleanly, else 1."""
    codes = await asyncio.gather(*(worker.stop(grace) for worker in workers))
    for worker, code in zip(workers, codes, strict=True):
        if code:
            log.error("worker %d %s at shutdown", worker.index, _ended(code))
    return 1 if any(codes) else 0


def _ended(code: int) -> str:
    """How a process ended, for people."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _on_signal(number: signal.Signals, stop: asyncio.Event) -> None:
    log.info("received %s, stopping the workers", number.name)
    stop.set()
