"""``SqliteDriver.read``: a short query answered on the event loop's thread from a read-only connection, without a
trip to the worker thread, seeing what is committed; anything it cannot answer at once goes to the worker."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.errors import StoreUnavailableError
from sidecar.state.sqlite.driver import SqliteDriver


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[SqliteDriver]:
    opened = await SqliteDriver.open(tmp_path / "a dir #1?" / "store.db")  # a path a URI must escape
    await opened.execute("CREATE TABLE t (n INTEGER)")
    await opened.execute("INSERT INTO t VALUES (1)")
    yield opened
    await opened.aclose()


def _threads_used(driver: SqliteDriver) -> list[int]:
    """The threads the worker connection runs statements on, from now on."""
    seen: list[int] = []
    driver._worker.db.set_trace_callback(lambda _: seen.append(threading.get_ident()))
    return seen


async def test_a_read_is_answered_on_the_loop_thread_without_the_worker(driver: SqliteDriver) -> None:
    worker = _threads_used(driver)
    assert await driver.read("SELECT n FROM t") == [(1,)]
    assert worker == []


async def test_a_read_sees_what_is_committed_and_not_a_transaction_under_way(driver: SqliteDriver) -> None:
    inside, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with driver.transaction(lock=None) as tx:
            await tx.execute("INSERT INTO t VALUES (2)")
            inside.set()
            await release.wait()

    task = asyncio.create_task(writer())
    await asyncio.wait_for(inside.wait(), 10)
    assert await asyncio.wait_for(driver.read("SELECT n FROM t ORDER BY n"), 10) == [(1,)]  # not waiting for it
    release.set()
    await task
    assert await driver.read("SELECT n FROM t ORDER BY n") == [(1,), (2,)]


async def test_a_read_it_cannot_answer_goes_to_the_worker_which_reports_it(driver: SqliteDriver) -> None:
    with pytest.raises(StoreUnavailableError, match=r"^SQLite store error: no such table"):  # the worker's report
        await driver.read("SELECT n FROM missing")


async def test_a_write_passed_as_a_read_is_not_run_on_the_loop_thread(tmp_path: Path) -> None:
    opened = await SqliteDriver.open(tmp_path / "store.db")
    try:
        await opened.execute("CREATE TABLE t (n INTEGER)")
        loop_thread = threading.get_ident()
        seen = _threads_used(opened)
        await opened.read("INSERT INTO t VALUES (3)")  # refused by the read-only connection: the worker runs it
        assert seen and loop_thread not in seen
        assert await opened.read("SELECT n FROM t") == [(3,)]
    finally:
        await opened.aclose()


async def test_a_read_from_another_thread_goes_to_the_worker(driver: SqliteDriver) -> None:
    assert await driver.read("SELECT n FROM t") == [(1,)]  # the reader belongs to this thread now
    loop = asyncio.get_running_loop()
    rows = await asyncio.to_thread(lambda: asyncio.run_coroutine_threadsafe(driver.read("SELECT n FROM t"),
                                                                             loop).result(10))
    assert rows == [(1,)]


async def test_a_database_locked_by_another_connection_is_still_read(driver: SqliteDriver, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "a dir #1?" / "store.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write lock: a WAL reader does not wait for it
        other.execute("INSERT INTO t VALUES (9)")
        worker = _threads_used(driver)
        assert await driver.read("SELECT n FROM t") == [(1,)]
        assert worker == []
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_reads_after_close_go_nowhere_near_a_closed_connection(tmp_path: Path) -> None:
    opened = await SqliteDriver.open(tmp_path / "store.db")
    assert await opened.read("SELECT 1") == [(1,)]
    await opened.aclose()
    with pytest.raises((StoreUnavailableError, RuntimeError)):
        await opened.read("SELECT 1")
