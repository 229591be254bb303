"""Places bounded per principal and in all (``sessions``, ``stream_slots``): who gives way to a newcomer.

A principal's next place ends their own oldest while they hold ``per_principal`` or everyone holds
``max_open``; when everyone's places are full and none is theirs, the newcomer is refused. A newcomer never
ends another principal's place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["to_end"]

T = TypeVar("T")


def to_end(mine: Sequence[T], held: int, *, per_principal: int, max_open: int) -> Sequence[T] | None:
    """Which of a principal's own places (``mine``, oldest first) end for them to take one more, of ``held``
    places taken in all; ``None``: refused, every place is someone else's."""
    if held >= max_open and not mine:
        return None
    ended = 0
    while ended < len(mine) and (len(mine) - ended >= per_principal or held - ended >= max_open):
        ended += 1
    return mine[:ended]
