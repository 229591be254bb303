"""What an aligned table is (``sidecar.cli.table``), as the tests check it on what a command printed."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len


def assert_aligned(table: str, count: int, width: int | None) -> list[int]:
    """Every line fits ``width`` cells; ``count`` columns, each starting at the same cell on every line, with
    the two cells before it blank on every line (no text runs over a gutter). Returns where they start."""
    lines = [cells(line) for line in table.splitlines()]
    longest = max(len(line) for line in lines)
    assert width is None or longest <= width, (width, table)
    padded = [line.ljust(longest) for line in lines]
    blank = [all(line[i] == " " for line in padded) for i in range(longest)]
    starts = [0] + [i for i in range(2, longest) if blank[i - 1] and blank[i - 2] and not blank[i]]
    assert len(starts) == count, (starts, table)
    return starts


def cells(line: str) -> str:
    """``line`` with one character per terminal cell: a wide character is followed by a NUL."""
    return "".join(ch + "\0" * (cell_len(ch) - 1) for ch in line)


def table_rows(table: str, headers: Sequence[str], *, anchor: int) -> list[list[str]]:
    """The rows of an aligned table with ``headers`` (checked), each cell's wrapped lines joined without their
    white space (compare with a value's ``"".join(value.split())``). A row starts on the line where column
    ``anchor`` (one whose values never wrap) is not blank; the lines up to the next such line are its
    continuation."""
    lines = _body(table, headers)
    rows: list[list[str]] = []
    for parts in lines:
        if parts[anchor] or not rows:
            rows.append(["" for _ in headers])
        rows[-1] = [done + part for done, part in zip(rows[-1], parts, strict=True)]
    return rows


def table_columns(table: str, headers: Sequence[str]) -> list[str]:
    """What each column of an aligned table with ``headers`` (checked) holds below its header, its lines joined
    without white space: every value of the column, in order, when nothing was cut."""
    return ["".join(parts) for parts in zip(*_body(table, headers), strict=True)]


def _body(table: str, headers: Sequence[str]) -> list[list[str]]:
    """The lines below the header of an aligned table, split into its columns (white space removed)."""
    starts = assert_aligned(table, len(headers), None)
    ends = [*(start - 2 for start in starts[1:]), None]
    lines = [["".join(line[start:end].replace("\0", "").split()) for start, end in zip(starts, ends, strict=True)]
             for line in map(cells, table.splitlines())]
    wanted, seen = ["".join(header.split()) for header in headers], ["" for _ in headers]
    while seen != wanted:
        assert lines and all(w.startswith(s) for w, s in zip(wanted, seen, strict=True)), (seen, wanted, table)
        seen = [done + part for done, part in zip(seen, lines.pop(0), strict=True)]
    return lines
