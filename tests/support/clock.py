"""A wall clock a test moves on, for what expires by the clock (previews, records past their retention)."""

from __future__ import annotations

import time

__all__ = ["MovedClock"]


class MovedClock:
    """``time.time()`` plus every ``advance`` so far: an expiry is reached when the test says, with no wait."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
