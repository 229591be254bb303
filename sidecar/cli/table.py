"""The one way ``toolbooth`` prints a table (``tools list``, ``previews list``, ``operations list``, ``policy
replay``, ``policy test --coverage``, ``toolbooth-documents list``): columns aligned by ``rich.table``.

A table fits the width of the terminal stdout is (``$COLUMNS`` when set, for stdout of any kind); stdout
that is not a terminal, without ``$COLUMNS``, has no width, so a table piped to a file or another command is
never wrapped. When a table is wider than its width, long values wrap onto more lines within their column
(a long word or id folds) or, in a column that does not wrap, are cut with an ellipsis; either way every
column starts at the same place on every line. A ``whole`` column (ids, times: what a person copies) is
neither: it keeps the width of its widest value, and the other columns give way. Columns keep their headers'
words whole while they can and are never narrower than ``NARROWEST`` cells, so a table too wide even so is
wider than its width, still aligned. Cells are plain text (no markup; control, bidirectional and invisible
characters shown as their code points, ``⟦U+202E⟧``); columns are two spaces apart and lines carry no
trailing spaces.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sidecar.display import visible

__all__ = ["NARROWEST", "Column", "column_widths", "fits", "render_table", "table_width"]

_GUTTER = 2  # spaces between columns
NARROWEST = 3  # cells: no column is made narrower (a header word then folds)


@dataclass(frozen=True, slots=True)
class Column:
    """A column: its header; whether a long value wraps (else it is cut with an ellipsis); right-aligned; ``whole``:
    never narrower than its widest value (neither wrapped nor cut)."""

    header: str
    wrap: bool = True
    right: bool = False
    whole: bool = False

    @property
    def min_width(self) -> int:
        """The width below which a column is made narrower only when nothing else fits: its header's longest
        word (so headers fold only then)."""
        return max(len(word) for word in self.header.split())


def table_width() -> int | None:
    """``$COLUMNS`` when it is a positive number, else the width of stdout's terminal, else ``None`` (no limit)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def render_table(columns: Sequence[Column], rows: Iterable[Sequence[str]], width: int | None = None) -> str:
    """``rows`` under the headers of ``columns``, fitted to ``width`` (default ``table_width()``)."""
    from rich.console import Console  # rich loads only for a command that prints a table
    from rich.table import Table
    from rich.text import Text

    headers = [Text(column.header, no_wrap=False, overflow="fold") for column in columns]  # even over a column
    cells = [headers, *([Text(_printable(cell)) for cell in row] for row in rows)]  # that does not wrap
    natural = _natural([[cell.plain for cell in row] for row in cells], len(columns))
    fit = width if width is not None else table_width()
    widths = natural if fit is None else column_widths(columns, natural, fit - _GUTTER * (len(columns) - 1))
    table = Table(box=None, pad_edge=False, padding=(0, _GUTTER // 2), header_style="", show_edge=False)
    for column, header, column_width in zip(columns, headers, widths, strict=True):
        table.add_column(header, justify="right" if column.right else "left", no_wrap=column.whole or not column.wrap,
                         overflow="fold" if column.wrap else "ellipsis", width=column_width)
    for row in cells[1:]:
        table.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=sum(widths) + _GUTTER * len(columns), color_system=None, markup=False, emoji=False,
            highlight=False, force_terminal=False, force_jupyter=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def fits(columns: Sequence[Column], rows: Iterable[Sequence[str]], width: int | None = None) -> bool:
    """Whether ``rows`` under ``columns`` fit ``width`` (default ``table_width()``; ``None``: any) without a value
    wrapped or cut."""
    fit = width if width is not None else table_width()
    if fit is None:
        return True
    natural = _natural([[column.header for column in columns], *([_printable(cell) for cell in row] for row in rows)],
                       len(columns))
    return sum(natural) + _GUTTER * (len(columns) - 1) <= fit


def column_widths(columns: Sequence[Column], natural: Sequence[int], room: int) -> list[int]:
    """Widths for columns of ``natural`` widths within ``room`` cells, taken a cell at a time from the widest
    column that may give one: first the columns that wrap, down to their ``min_width``, then those that do not,
    then any, down to ``NARROWEST``; a ``whole`` column keeps its natural width. A table that does not fit even so
    is wider than ``room``."""
    widths = list(natural)
    passes = ((lambda column: column.wrap, lambda column: column.min_width),
              (lambda column: not column.wrap, lambda column: column.min_width),
              (lambda column: True, lambda column: NARROWEST))
    for eligible, least in passes:
        floors = [min(n, least(column)) for n, column in zip(natural, columns, strict=True)]
        while sum(widths) > room:
            shrinkable = [i for i, column in enumerate(columns)
                          if not column.whole and eligible(column) and widths[i] > floors[i]]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: widths[i])
            # in one step what a cell at a time would come to: down to the next widest, or as far as needed
            runner_up = max((widths[i] for i in shrinkable if i != widest), default=0)
            excess = sum(widths) - room
            widths[widest] = min(widths[widest] - 1, max(floors[widest], runner_up, widths[widest] - excess))
    return widths


def _natural(rows: Sequence[Sequence[str]], count: int) -> list[int]:
    """The width of each of ``count`` columns: its widest line of plain text, in terminal cells."""
    from rich.cells import cell_len

    return [max(max((cell_len(line) for line in row[i].splitlines()), default=0) for row in rows)
            for i in range(count)]


def _printable(cell: str) -> str:
    """``cell`` with tabs as spaces and every character a terminal would obey (colours, cursor moves) or not show
    (bidirectional controls, zero-width characters) marked by its code point (``sidecar.display``)."""
    return visible(cell.replace("\t", " "))
