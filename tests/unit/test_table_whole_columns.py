"""A ``whole`` column of ``sidecar.cli.table`` (ids, times) keeps its widest value's width at any table width."""

from __future__ import annotations

import pytest

from sidecar.cli.table import Column, column_widths, fits, render_table
from tests.support.tables import assert_aligned, table_rows

COLUMNS = (Column("ID", whole=True), Column("TOOL"), Column("EXPIRES", whole=True), Column("REASON"))
ROWS = [("0f3a9c1e" * 6, "send_email", "2026-12-01T10:15:00Z", "approval is configured for this tool"),
        ("77aa" * 12, "calculate", "2026-12-01T10:16:00Z", "the conversation carries untrusted")]


@pytest.mark.parametrize("width", [120, 100, 80, 40])
def test_whole_columns_never_fold_and_the_others_give_way(width: int) -> None:
    table = render_table(COLUMNS, ROWS, width)
    assert_aligned(table, 4, max(width, 48 + 20 + 3 * 2 + 2 * 3))  # wider only by what the whole columns need
    rows = table_rows(table, ["ID", "TOOL", "EXPIRES", "REASON"], anchor=0)
    assert rows == [[row[0], row[1], row[2], "".join(row[3].split())] for row in ROWS]
    for row in ROWS:  # each id and time on its row's first line
        assert any(line.startswith(row[0]) and row[2] in line for line in table.splitlines())


def test_whole_columns_keep_their_natural_width() -> None:
    assert column_widths(COLUMNS, [48, 10, 20, 36], 60) == [48, 3, 20, 3]


def test_fits_says_whether_nothing_would_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fits(COLUMNS, ROWS, 48 + 10 + 20 + 36 + 2 * 3)
    assert not fits(COLUMNS, ROWS, 48 + 10 + 20 + 36 + 2 * 3 - 1)
    monkeypatch.setenv("COLUMNS", "80")
    assert not fits(COLUMNS, ROWS)
    monkeypatch.delenv("COLUMNS")
    assert fits(COLUMNS, ROWS)  # no width (stdout, captured, is not a terminal; no $COLUMNS): anything fits
