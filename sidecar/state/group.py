"""Group commit: the writes concurrent calls queue, committed together, one transaction (one fsync) per batch.

A caller hands a ``Unit`` to ``GroupCommit.run`` and waits. One drain task takes every unit queued so far,
stages their statements in one transaction (``Unit.stage``) and commits it; only then is each caller's
wait over, with its unit's ``result``: what a caller is told is in the store is durable. While a batch
commits, the next one queues: batches grow with the load, and a unit queued alone is written at once
(no added delay). A batch that fails because the store is unavailable fails every unit in it (each
caller decides to retry, as for a write of its own); one that fails for any other reason (data the
store or the chain refuses) is written again one unit per transaction, in order, so one bad unit costs
the others nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from sidecar.errors import StoreRefusedError, StoreUnavailableError
from sidecar.state.driver import Transaction

__all__ = ["GroupCommit", "Unit"]

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class Unit(Protocol[T_co]):
    """One caller's write: statements staged into a batch's transaction, a result read once it committed."""

    async def stage(self, tx: Transaction) -> None:
        """Add this write's statements to ``tx`` (``Transaction.later``: results are read after the commit)."""
        ...

    def result(self) -> T_co:
        """What the write found, once the transaction holding it committed."""
        ...

    def failed(self) -> None:
        """The transaction holding it rolled back (or may have: its commit failed); called before any later
        batch is staged."""
        ...


class GroupCommit:
    """Runs queued units in batches, one ``transaction()`` each."""

    def __init__(self, transaction: Callable[[], AbstractAsyncContextManager[Transaction]]) -> None:
        self._transaction = transaction
        self._queue: list[tuple[Unit[Any], asyncio.Future[Any]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0  # committed transactions, for tests and benchmarks
        self.units = 0  # units they held

    async def run(self, unit: Unit[T]) -> T:
        """Queue ``unit`` and return its result once the batch holding it committed (or raise what failed it)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((unit, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await self._commit(batch)
            except StoreRefusedError:
                for single in batch:
                    await self._alone(single)
            except StoreUnavailableError as exc:
                _fail(batch, exc)
            except Exception:  # noqa: BLE001 - something the chain refuses (a value it cannot hash)
                for single in batch:
                    await self._alone(single)
            except BaseException as exc:  # cancelled (the loop is closing): no caller waits forever
                _fail(batch, exc)
                raise

    async def _alone(self, single: tuple[Unit[Any], asyncio.Future[Any]]) -> None:
        try:
            await self._commit([single])
        except Exception as exc:  # noqa: BLE001 - handed to its caller
            _fail([single], exc)

    async def _commit(self, batch: list[tuple[Unit[Any], asyncio.Future[Any]]]) -> None:
        try:
            async with self._transaction() as tx:
                for unit, _ in batch:
                    await unit.stage(tx)
        except BaseException:
            for unit, _ in batch:
                unit.failed()
            raise
        self.batches += 1
        self.units += len(batch)
        for unit, future in batch:
            if future.done():  # its caller went away; the write stands
                continue
            try:
                future.set_result(unit.result())
            except Exception as exc:  # noqa: BLE001 - the unit's own verdict on what it found
                future.set_exception(exc)


def _fail(batch: list[tuple[Unit[Any], asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)
