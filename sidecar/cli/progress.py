"""Progress of long commands (``audit verify``, ``audit export``, ``policy replay``, ``policy test``, document
indexing), drawn on stderr by ``rich.progress`` for the person at the terminal.

It is drawn only when stderr is a terminal, and never with ``--no-progress``, ``TOOLBOOTH_NO_PROGRESS`` set (to
anything but 0/false/no/off) or ``TERM=dumb``; a command that prints while it runs (``audit export``) draws it
only when its stdout is not that terminal. Stdout is never touched: the result printed there is byte for
byte the same with and without it, and the bar is erased when the work ends. ``NO_COLOR`` leaves it drawn,
without colour (as ``rich`` does).

A ``Meter`` is told how far the work is (``update(completed, total)``); without a total it shows a spinner
with a running count instead of a bar.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sidecar.config import ENV_NO_PROGRESS

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["Meter", "meter", "progress_flag", "progress_wanted"]


def progress_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: never draw the progress bar (``$TOOLBOOTH_NO_PROGRESS`` does the same)."""
    parser.add_argument("--no-progress", action="store_true",
                        help=f"no progress bar on stderr (default: one while stderr is a terminal, unless "
                             f"${ENV_NO_PROGRESS} is set or TERM=dumb)")


def progress_wanted(args: argparse.Namespace, *, prints_while_working: bool = False) -> bool:
    """Whether to draw progress for the command of ``args`` (see the module's docstring)."""
    if getattr(args, "no_progress", False) or _set(os.environ.get(ENV_NO_PROGRESS)):
        return False
    if os.environ.get("TERM") == "dumb" or not _terminal(sys.stderr):
        return False
    return not (prints_while_working and _terminal(sys.stdout))


def _set(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def _terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Meter:
    """How far one piece of work is; draws nothing unless it was made by ``meter`` with progress wanted."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress, self._task = progress, task

    @property
    def drawn(self) -> bool:
        """Whether anything is drawn (so that a command counts its work's total only then)."""
        return self._progress is not None

    def update(self, completed: int, total: int | None = None) -> None:
        """``completed`` of ``total`` units done (a total once given is kept)."""
        if self._progress is not None and self._task is not None:
            if total is None:
                self._progress.update(self._task, completed=completed)
            else:
                self._progress.update(self._task, completed=completed, total=total)

    def describe(self, description: str) -> None:
        """Say what is being done now; the count starts again, without a total."""
        if self._progress is not None and self._task is not None:
            self._progress.reset(self._task, total=None, description=description)


@contextlib.contextmanager
def meter(description: str, *, total: int | None = None, enabled: bool) -> Iterator[Meter]:
    """A ``Meter`` for the work of the ``with`` block, drawn on stderr while it runs when ``enabled``."""
    if not enabled:
        yield Meter()
        return
    from rich.console import Console  # rich loads only when something is drawn
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr, stderr=True, markup=False, highlight=False)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, redirect_stdout=False, redirect_stderr=False) as drawn:
        yield Meter(drawn, drawn.add_task(description, total=total))
