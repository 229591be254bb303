"""The worker processes of each isolated plugin: a fixed number, one call at a time each, replaced when lost.

``WorkerPool.lease`` waits for an idle worker (within the call's deadline: a call still waiting at
its deadline never started). When the call ends, the worker is idle again, unless the call was
interrupted (its deadline passed, it was cancelled) or the process ended: then that worker alone is
stopped (SIGTERM, SIGKILL after ``stop_grace_seconds``), the lease ends once it is gone, and another
one is started in the background; the other calls of the pool go on. The workers start with the
sidecar (``start``, from ``sidecar.bootstrap.open_pipeline``; a pipeline built with ``assemble`` alone
starts them at its first isolated call) and stop at ``aclose``: idle ones are asked to exit, busy
ones are terminated, all within the grace, then killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

from sidecar.config import IsolationSettings
from sidecar.tools.isolation.paths import HandlerPath
from sidecar.tools.isolation.plan import IsolationPlan
from sidecar.tools.isolation.process import Worker, exit_reason

__all__ = ["START_TIMEOUT_SECONDS", "ProcessPools", "WorkerPool"]

log = logging.getLogger("toolbooth.isolation")

START_TIMEOUT_SECONDS = 60.0  # for a worker to import its handlers
_RETRY_SECONDS = (0.5, 30.0)  # first and longest wait before starting a lost worker's replacement again


class WorkerPool:
    """The ``size`` worker processes of plugin ``plugin``, running its isolated ``handlers``."""

    def __init__(self, plugin: str, handlers: Mapping[str, HandlerPath], *, size: int, grace: float) -> None:
        self.plugin, self._handlers, self._size, self._grace = plugin, dict(handlers), size, grace
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
        self._workers: set[Worker] = set()  # started and not yet retired
        self._stopping: set[asyncio.Task[None]] = set()  # never cancelled: each ends a process
        self._starting: set[asyncio.Task[None]] = set()  # replacements: cancelled at close
        self._started: asyncio.Future[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Start the workers (once); ``PluginLoadError`` if one cannot import its handlers."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Worker]:
        """An idle worker, for one call; stopped and replaced if the call does not end normally."""
        await self.start()
        while True:
            if self._closed:
                raise RuntimeError(f"the worker processes of plugin {self.plugin!r} are stopped")
            worker = await self._idle.get()
            if worker.alive:
                break
        try:
            yield worker
        finally:
            if worker.alive and not worker.spoiled and not self._closed:
                self._idle.put_nowait(worker)
            else:
                self._retire(worker, "its call was interrupted (its deadline passed, or it was cancelled)")
                await worker.stopped.wait()

    async def aclose(self) -> None:
        """Stop every worker: idle ones are asked to exit, busy ones terminated; all killed after the grace."""
        self._closed = True
        pending = [*self._starting, *([self._started] if self._started and not self._started.done() else [])]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        idle = set()
        while not self._idle.empty():
            idle.add(self._idle.get_nowait())
        for worker in list(self._workers):
            self._retire(worker, "the sidecar stops", ask=worker in idle)
        await asyncio.gather(*self._stopping, return_exceptions=True)

    async def _start(self) -> None:
        started = await asyncio.gather(*(self._spawn() for _ in range(self._size)), return_exceptions=True)
        failed = [result for result in started if isinstance(result, BaseException)]
        if failed:
            workers, self._workers = list(self._workers), set()
            await asyncio.gather(*(worker.stop(self._grace, ask=True) for worker in workers))
            raise failed[0]
        for worker in started:
            assert isinstance(worker, Worker)
            self._idle.put_nowait(worker)
        log.info("plugin %r: %d worker process(es) (pids %s) run its isolated tools %s", self.plugin, self._size,
                 ", ".join(str(worker.pid) for worker in self._workers), ", ".join(self._handlers))

    async def _spawn(self) -> Worker:
        worker = await Worker.spawn(self.plugin, self._handlers, on_end=self._ended, timeout=START_TIMEOUT_SECONDS)
        self._workers.add(worker)
        return worker

    def _ended(self, worker: Worker) -> None:
        """A worker's process ended: if no one is stopping it, it ended by itself (idle, or mid-call)."""
        self._retire(worker, "it ended by itself")

    def _retire(self, worker: Worker, why: str, *, ask: bool = False) -> None:
        """Stop ``worker`` (once), then start another unless the pool is closed."""
        if worker in self._workers:
            self._workers.discard(worker)
            self._track(self._stopping, self._stop(worker, why, ask=ask))

    async def _stop(self, worker: Worker, why: str, *, ask: bool) -> None:
        code = await worker.stop(self._grace, ask=ask)
        if self._closed:
            log.debug("plugin %r: worker process %d stopped (%s)", self.plugin, worker.pid, exit_reason(code))
            return
        log.warning("plugin %r: worker process %d stopped, %s (%s); starting another", self.plugin, worker.pid,
                    why, exit_reason(code))
        self._track(self._starting, self._replace())

    async def _replace(self) -> None:
        wait, longest = _RETRY_SECONDS
        while True:
            try:
                worker = await self._spawn()
            except Exception as exc:  # noqa: BLE001 - whatever stopped it: logged, tried again
                log.error("plugin %r: cannot start a worker process (%s); trying again in %.1f s", self.plugin, exc,
                          wait)
                await asyncio.sleep(wait)
                wait = min(longest, wait * 2)
                continue
            self._idle.put_nowait(worker)
            return

    def _track(self, tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)


class ProcessPools:
    """A ``WorkerPool`` for each plugin of ``plan``; found by the name of an isolated tool."""

    def __init__(self, plan: IsolationPlan, settings: IsolationSettings) -> None:
        self._pools = [WorkerPool(plugin, handlers, size=settings.workers_per_plugin,
                                  grace=settings.stop_grace_seconds) for plugin, handlers in plan.plugins.items()]
        self._by_tool = {tool: pool for pool, handlers in zip(self._pools, plan.plugins.values(), strict=True)
                         for tool in handlers}

    def get(self, tool: str) -> WorkerPool | None:
        """The pool that runs ``tool``, ``None`` if it is not isolated."""
        return self._by_tool.get(tool)

    async def start(self) -> None:
        """Start every pool's workers; on a failure, stop them all and raise it."""
        try:
            for pool in self._pools:  # one plugin after the other: the machine's cores are shared
                await pool.start()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        await asyncio.gather(*(pool.aclose() for pool in self._pools))
