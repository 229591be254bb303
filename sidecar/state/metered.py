"""``CountingDriver``: a ``Driver`` whose failed statements are counted (``toolbooth_store_errors_total{op}``).

``op`` names what failed: the ``StoreStatements`` field of the statement (``claim``, ``insert_audit``,
``get_preview``...; a statement deferred to the commit is named by the error of its trip), ``other`` for a
statement that is none of them, or ``session`` / ``transaction`` when the step itself failed (a connection
that could not be had, a commit) rather than one of its statements. Each failed attempt counts: a write
retried three times before it succeeds counts three.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any

from sidecar.errors import StoreUnavailableError
from sidecar.state.driver import (
    Deferred,
    Dialect,
    Driver,
    Locks,
    Params,
    Row,
    StatementRunner,
    Transaction,
    failed_statement,
)
from sidecar.state.statements import StoreStatements

__all__ = ["CountingDriver"]

Count = Callable[[str], None]


class _Counting:
    """Runs statements with ``inner``, counting each that fails by its name."""

    def __init__(self, inner: Any, names: Mapping[str, str], count: Count) -> None:
        self._inner, self._names, self._count = inner, names, count
        self.failed = False  # a statement of this runner failed (and was counted)

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            rows: list[Row] = await self._inner.fetch(sql, params)
        except StoreUnavailableError:
            self._failed(sql)
            raise
        return rows

    async def execute(self, sql: str, params: Params = ()) -> int:
        try:
            changed: int = await self._inner.execute(sql, params)
        except StoreUnavailableError:
            self._failed(sql)
            raise
        return changed

    def _failed(self, sql: str) -> None:
        self.failed = True
        self._count(self._names.get(sql, "other"))


class _CountingTransaction(_Counting):
    async def later(self, sql: str, params: Params = ()) -> Deferred:
        try:
            deferred: Deferred = await self._inner.later(sql, params)
        except StoreUnavailableError:
            self._failed(sql)
            raise
        return deferred

    async def execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        try:
            await self._inner.execute_many(sql, rows)
        except StoreUnavailableError:
            self._failed(sql)
            raise

    async def execute_script(self, script: str) -> None:
        try:
            await self._inner.execute_script(script)
        except StoreUnavailableError:
            self._failed(script)
            raise


class CountingDriver(_Counting):
    """``inner``, the failures of its statements (``statements``) and steps counted with ``count``."""

    def __init__(self, inner: Driver, statements: StoreStatements, count: Count) -> None:
        super().__init__(inner, {getattr(statements, f.name): f.name for f in fields(statements)}, count)
        self.inner = inner

    @property
    def dialect(self) -> Dialect:
        return self.inner.dialect

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return await self.inner.read(sql, params)
        except StoreUnavailableError:
            self._failed(sql)
            raise

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[StatementRunner]:
        runner: _Counting | None = None
        try:
            async with self.inner.session() as inner:
                runner = _Counting(inner, self._names, self._count)
                yield runner
        except StoreUnavailableError:
            if runner is None or not runner.failed:
                self._count("session")
            raise

    @contextlib.asynccontextmanager
    async def transaction(self, *, lock: Locks) -> AsyncIterator[Transaction]:
        runner: _CountingTransaction | None = None
        try:
            async with self.inner.transaction(lock=lock) as inner:
                runner = _CountingTransaction(inner, self._names, self._count)
                yield runner
        except StoreUnavailableError as exc:
            if (deferred := failed_statement(exc)) is not None:  # run with the commit (SQLite): named by it
                self._count(self._names.get(deferred, "other"))
            elif runner is None or not runner.failed:
                self._count("transaction")
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()
