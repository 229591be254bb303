"""Log records that repeat are rate-limited, so a flood writes a few lines a minute rather than one per event.

Floods come from outside: asyncio's ``socket.accept() out of system resource`` each time a listener retries
while file descriptors run out, uvicorn's warning for each malformed request, one warning per refused
connection. ``limit_repeats(*names)`` gives each named logger one ``RepeatLimit`` (the records created by
that logger; its children have their own). Records are of one kind when they come from the same logger,
source line and first line of message template; of each kind at most ``burst`` pass per ``window``
seconds. The first to pass after some were dropped says how many, in its message (``(37 similar messages
suppressed)``) and as its ``suppressed`` field (JSON lines carry it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RepeatLimit", "limit_repeats"]

_MAX_KINDS = 1024  # kinds remembered at once; past it they are all forgotten (each starts a new window)


@dataclass
class _Window:
    opened: float
    passed: int = 0
    dropped: int = 0


class RepeatLimit(logging.Filter):
    """Lets at most ``burst`` records of a kind through per ``window`` seconds, and counts the rest."""

    def __init__(self, *, burst: int = 5, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._burst, self._window, self._clock = burst, window, clock
        self._windows: dict[tuple[str, str, int, str], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            window, carried = self._window_of(record)
            if window.passed >= self._burst:
                window.dropped += 1
                return False
            window.passed += 1
        if carried:
            record.msg, record.args = f"{record.getMessage()} ({carried} similar messages suppressed)", None
            record.suppressed = carried
        return True

    def _window_of(self, record: logging.LogRecord) -> tuple[_Window, int]:
        """The open window of the record's kind (a new one once the last is over) and what the last one dropped."""
        key = (record.name, record.pathname, record.lineno, str(record.msg).partition("\n")[0])
        now, window = self._clock(), self._windows.get(key)
        if window is not None and now - window.opened < self._window:
            return window, 0
        if window is None and len(self._windows) >= _MAX_KINDS:
            self._windows.clear()
        self._windows[key] = _Window(now)
        return self._windows[key], 0 if window is None else window.dropped


def limit_repeats(*names: str) -> None:
    """Give each logger of ``names`` a ``RepeatLimit``, unless it has one."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(kept, RepeatLimit) for kept in logger.filters):
            logger.addFilter(RepeatLimit())
