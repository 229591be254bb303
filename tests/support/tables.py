"""What an aligned table is (``sidecar.cli.table``), as the tests check it on what a command printed."""

from __future__ import annotations

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


def table_rows(table: str, count: int, *, anchor: int) -> list[list[str]]:
    """The rows of an aligned table, header first, each cell's wrapped lines joined without their white space
    (compare with a value's ``"".join(value.split())``). A row starts on the line where column ``anchor`` (one
    that does not wrap) is not blank; the lines before the next such line are its continuation."""
    starts = assert_aligned(table, count, None)
    ends = [*(start - 2 for start in starts[1:]), None]
    rows: list[list[str]] = []
    pending: list[list[str]] = [[] for _ in range(count)]
    for line in (cells(line) for line in table.splitlines()):
        parts = [line[start:end].replace("\0", "").strip() for start, end in zip(starts, ends, strict=True)]
        if parts[anchor] and any(pending[anchor]):
            rows.append(["".join(fragments) for fragments in pending])
            pending = [[] for _ in range(count)]
        for fragments, part in zip(pending, parts, strict=True):
            fragments.append("".join(part.split()))
    rows.append(["".join(fragments) for fragments in pending])
    return rows
