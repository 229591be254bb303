"""The small SQL driver a backend supplies, so that the store (``SqlStore``) and the migrator are written once.

A driver runs single statements (each committed on its own), sessions (statements on one connection
that no other statement of the driver comes between) and transactions that hold a named lock.
What differs between SQL dialects is data, not code: ``Dialect``. Statements are written with ``?``
placeholders; ``Dialect.sql`` puts in the driver's own. Every database error leaves a driver as
``StoreUnavailableError`` (retryable), its message never showing a password.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Deferred", "Dialect", "Driver", "Locks", "Params", "Row", "StatementRunner", "Transaction",
           "failed_statement", "naming"]

Row = tuple[Any, ...]
Params = Sequence[Any]
Locks = int | Sequence[int] | None  # the named locks of a transaction


@dataclass(frozen=True, slots=True)
class Dialect:
    """What a backend's SQL spells differently. ``{}`` in a template is its operand."""

    name: str  # the backend, also the folder of its migrations: ``migrations/<name>/NNNN_*.sql``
    placeholder: str  # of a statement parameter: ``?`` or ``%s``
    now: str  # an expression: the current time, as timestamp columns store it
    epoch: str  # template: a timestamp column as epoch seconds
    timestamp: str  # template: epoch seconds as a timestamp column stores them
    insert_new: str  # template: an ``INSERT INTO {}`` (table, columns, values) that skips a row whose key is taken
    returning: str  # template: ``{}``, a statement, giving back the columns of the rows it wrote (the second ``{}``)
    table_exists: str  # a query with one parameter, a table name: one row, true if the table exists
    version_table: str  # the DDL of ``toolbooth_schema`` (version, name, applied_at)
    single_writer: bool  # one write transaction at a time (SQLite): claims are group-committed with the rest

    def sql(self, statement: str) -> str:
        """``statement`` with its ``?`` placeholders in this dialect's style."""
        return statement.replace("?", self.placeholder)


class StatementRunner(Protocol):
    """Running one statement."""

    async def fetch(self, sql: str, params: Params = ()) -> list[Row]:
        """The rows ``sql`` returns."""
        ...

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run ``sql``; the number of rows it inserted, changed or deleted."""
        ...


def naming(error: Exception, statement: str | None) -> Exception:
    """``error``, saying that the deferred ``statement`` (if any) is the one that failed."""
    error.statement = statement  # type: ignore[attr-defined]
    return error


def failed_statement(error: BaseException) -> str | None:
    """The SQL of the statement run by ``Transaction.later`` whose failure ``error`` reports, if it says."""
    statement = getattr(error, "statement", None)
    return statement if isinstance(statement, str) else None


@dataclass(slots=True)
class Deferred:
    """What a statement run by ``Transaction.later`` returned, set once it ran."""

    rows: list[Row] = field(default_factory=list)
    changed: int = -1  # rows inserted, changed or deleted


class Transaction(StatementRunner, Protocol):
    """Statements inside one transaction, on one connection."""

    async def later(self, sql: str, params: Params = ()) -> Deferred:
        """Run ``sql`` by the time the transaction commits, in order with its other statements; what it returned
        is in the ``Deferred`` once it ran (SQLite runs it with the next statement whose result is needed,
        or with ``COMMIT``: a transaction of many such statements is one trip to its thread; the error of that
        trip then names it: ``failed_statement``)."""
        ...

    async def execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        """Run ``sql`` once per parameter row; ``rows`` may be lazy, consumed by the time the transaction
        commits."""
        ...

    async def execute_script(self, script: str) -> None:
        """Run a file of ``;``-terminated statements without parameters (a migration)."""
        ...


class Driver(StatementRunner, Protocol):
    """A database: single statements (each committed on its own), sessions and locked transactions."""

    @property
    def dialect(self) -> Dialect:
        """How this backend spells what differs."""
        ...

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        """The rows of a short query that writes nothing, answered where it costs least: as ``fetch``, or (SQLite)
        from the calling thread when the database answers at once."""
        ...

    def session(self) -> AbstractAsyncContextManager[StatementRunner]:
        """Statements on one connection, no other statement of this driver between them. On PostgreSQL they
        are autocommit statements: other sidecars' writes may come between them. On SQLite the session is a
        ``BEGIN IMMEDIATE`` transaction: nothing comes between them."""
        ...

    def transaction(self, *, lock: Locks) -> AbstractAsyncContextManager[Transaction]:
        """A transaction holding the lock named ``lock`` (a signed 64-bit key; several, taken in the order given,
        which every holder of more than one must keep ascending; ``None``: no named lock) until it commits, or rolls
        back on an exception: whoever else takes one of those locks, in any process, waits. A backend may lock more
        (SQLite takes its one write lock), never less."""
        ...

    async def aclose(self) -> None:
        """Release connections and threads."""
        ...
