"""Transient failures, retries and timeouts of both tools through a real sidecar.

The design: each tool is retried once on a transient failure of its backend (``SERVICE_UNAVAILABLE``), and
has a timeout of its own (search 3 s, read 2 s). SQLite fails for real when another connection holds the
file exclusively, and through a connection factory that fails once (a deterministic transient failure);
PostgreSQL behind a proxy that drops connections (a restarting server) or goes silent (a partition).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from plugins.documents.tests.support import ENV_POSTGRES_DSN, Corpus, DroppingProxy, Sidecars, call
from sidecar.contract import ErrorCode, Recovery, Status, ToolResult
from tests.support.tcp_proxy import StallingProxy
from toolbooth_documents.settings import IndexSettings
from toolbooth_documents.sqlite_index import SqliteIndex
from toolbooth_documents.tools import build_tools

pytestmark = pytest.mark.integration

ARGUMENTS: dict[str, Callable[[Corpus], dict[str, Any]]] = {
    "search_documents": lambda documents: {"query": "launch"},
    "read_document": lambda documents: {"document_id": documents.ids["acme/alpha/plan.md"]},
}
TIMEOUTS = {"search_documents": 3.0, "read_document": 2.0}
UNAVAILABLE = "the document index is unavailable right now"


class FlakyConnect:
    """``sqlite3.connect``, except that the next ``failing`` connections fail as a disk error does."""

    def __init__(self) -> None:
        self.failing = self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        self.calls += 1
        if self.failing:
            self.failing -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return sqlite3.connect(*args, **kwargs)


def succeeded(result: ToolResult, attempts: int) -> None:
    assert result.status is Status.SUCCESS, result.error
    assert result.meta.attempt == attempts


def unavailable(result: ToolResult) -> None:
    """The result of a call whose index failed on both attempts."""
    assert result.status is Status.ERROR and result.error is not None
    assert (result.error.code, result.error.message, result.error.retryable, result.error.recovery) == (
        ErrorCode.SERVICE_UNAVAILABLE, UNAVAILABLE, True, Recovery.RETRY_WITH_BACKOFF)
    assert result.meta.attempt == 2


def _upstream(dsn: str) -> tuple[str, int]:
    parts = conninfo_to_dict(dsn)
    return str(parts.get("host", "127.0.0.1")), int(parts.get("port", 5432))


@pytest.mark.parametrize("settings", ["sqlite"], indirect=True)
@pytest.mark.parametrize("tool", sorted(ARGUMENTS))
async def test_retries_once_after_a_transient_sqlite_failure(settings: IndexSettings, documents: Corpus,
                                                             sidecars: Sidecars, tool: str) -> None:
    connect = FlakyConnect()
    index = SqliteIndex(settings.sqlite_path, connect=connect)
    address = await sidecars.start(build_tools(lambda ctx: index))
    arguments = ARGUMENTS[tool](documents)
    succeeded(await call(address, tool, arguments), attempts=1)  # the cursor key is read once, here
    connect.failing, before = 1, connect.calls
    succeeded(await call(address, tool, arguments), attempts=2)
    assert connect.calls - before == 2
    connect.failing, before = 3, connect.calls
    unavailable(await call(address, tool, arguments))  # retried once, not more
    assert connect.calls - before == 2


@pytest.mark.parametrize("settings", ["sqlite"], indirect=True)
@pytest.mark.parametrize("tool", sorted(ARGUMENTS))
async def test_a_locked_sqlite_index_is_unavailable_after_two_attempts(
        settings: IndexSettings, documents: Corpus, address: str, tool: str, caplog: pytest.LogCaptureFixture) -> None:
    arguments = ARGUMENTS[tool](documents)
    succeeded(await call(address, tool, arguments), attempts=1)
    holder = sqlite3.connect(settings.sqlite_path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")  # WAL with exclusive locking: no other connection may read
        with caplog.at_level(logging.WARNING):
            result = await call(address, tool, arguments)
    finally:
        holder.close()
    unavailable(result)
    assert result.meta.duration_ms < TIMEOUTS[tool] * 1000  # each attempt waits for the lock half the time left
    assert str(settings.sqlite_path) not in result.model_dump_json()  # the cause is the operator's: logged
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("document index unavailable")]
    assert [message.split(":")[0] for message in logged] == [
        "document index unavailable (attempt 1)", "document index unavailable (attempt 2)"]
    assert all("database is locked" in message for message in logged)
    succeeded(await call(address, tool, arguments), attempts=1)


@pytest.mark.parametrize("settings", ["postgres"], indirect=True)
@pytest.mark.parametrize("tool", sorted(ARGUMENTS))
async def test_retries_once_after_a_dropped_postgres_connection(settings: IndexSettings, documents: Corpus,
                                                                sidecars: Sidecars, tool: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings.dsn is not None
    async with DroppingProxy.running(_upstream(settings.dsn)) as proxy:
        monkeypatch.setenv(ENV_POSTGRES_DSN, make_conninfo(settings.dsn, host="127.0.0.1",
                                                           port=str(proxy.port)))
        address = await sidecars.start()
        arguments = ARGUMENTS[tool](documents)
        succeeded(await call(address, tool, arguments), attempts=1)
        proxy.dropping = 1
        succeeded(await call(address, tool, arguments), attempts=2)
        assert proxy.dropped == 1
        proxy.dropping = 3
        result = await call(address, tool, arguments)
        unavailable(result)
        assert proxy.dropped == 3 and "pw-never-shown" not in result.model_dump_json()


@pytest.mark.parametrize("settings", ["postgres"], indirect=True)
@pytest.mark.parametrize("tool", sorted(ARGUMENTS))
async def test_a_stalled_postgres_index_times_out_at_the_tools_timeout(settings: IndexSettings, documents: Corpus,
                                                                       sidecars: Sidecars, tool: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings.dsn is not None
    async with StallingProxy.running(_upstream(settings.dsn)) as proxy:
        monkeypatch.setenv(ENV_POSTGRES_DSN, make_conninfo(settings.dsn, host="127.0.0.1",
                                                           port=str(proxy.port)))
        address = await sidecars.start()
        arguments = ARGUMENTS[tool](documents)
        succeeded(await call(address, tool, arguments), attempts=1)
        proxy.stall()
        started = time.monotonic()
        result = await call(address, tool, arguments)
        elapsed = time.monotonic() - started
        proxy.resume()
        assert result.status is Status.ERROR and result.error is not None
        assert (result.error.code, result.error.retryable) == (ErrorCode.TIMEOUT, True)
        assert TIMEOUTS[tool] - 0.1 <= elapsed < TIMEOUTS[tool] + 1.5
        assert result.meta.attempt == 1  # no time left for another
        succeeded(await call(address, tool, arguments), attempts=1)
