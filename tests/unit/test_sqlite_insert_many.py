"""``insert_many``: the rows of an ``INSERT ... VALUES (?, ...)`` go as a few multi-row statements, in order, within
SQLite's limit on variables; any other statement runs row by row as ``executemany`` runs it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from sidecar.state.sqlite.driver import insert_many

INSERT = "INSERT INTO t (a, b, c) VALUES (?, ?, ?)"


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:", isolation_level=None)
    connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, a, b, c)")
    yield connection
    connection.close()


def _statements(db: sqlite3.Connection) -> list[str]:
    """The INSERT statements run from now on, as SQLite expands them (their values written out)."""
    seen: list[str] = []
    db.set_trace_callback(lambda statement: seen.append(statement) if statement.startswith("INSERT") else None)
    return seen


def _rows(n: int) -> list[tuple[int, str, None]]:
    return [(n, f"row {n}", None) for n in range(n)]


def test_rows_go_in_order_in_chunks_that_are_powers_of_two(db: sqlite3.Connection) -> None:
    db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 3 * 8)  # at most 8 rows of 3 values per statement
    seen = _statements(db)
    insert_many(db, INSERT, iter(_rows(21)))  # a lazy iterable, as the audit chain hands it over
    assert db.execute("SELECT a, b, c FROM t ORDER BY id").fetchall() == _rows(21)
    assert [statement.count("'row ") for statement in seen] == [8, 8, 4, 1]  # 21 = 8 + 8 + 4 + 1


def test_a_batch_of_audit_size_is_a_handful_of_statements(db: sqlite3.Connection) -> None:
    seen = _statements(db)
    insert_many(db, INSERT, _rows(992))
    assert db.execute("SELECT count(*), min(a), max(a) FROM t").fetchone() == (992, 0, 991)
    assert len(seen) == bin(992).count("1") == 5  # row by row it was 992: one wait for the GIL each


def test_no_rows_no_statement(db: sqlite3.Connection) -> None:
    seen = _statements(db)
    insert_many(db, INSERT, [])
    assert seen == []


def test_another_statement_runs_row_by_row(db: sqlite3.Connection) -> None:
    insert_many(db, INSERT, _rows(3))
    insert_many(db, "UPDATE t SET c = ? WHERE a = ?", [("x", 0), ("y", 2)])
    assert db.execute("SELECT a, c FROM t ORDER BY id").fetchall() == [(0, "x"), (1, None), (2, "y")]


def test_a_refused_row_fails_the_statement_and_names_nothing_else(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE u (a INTEGER NOT NULL)")
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
        insert_many(db, "INSERT INTO u (a) VALUES (?)", [(1,), (None,), (3,)])
    assert db.execute("SELECT count(*) FROM u").fetchone() == (0,)  # one statement: none of its rows stays
