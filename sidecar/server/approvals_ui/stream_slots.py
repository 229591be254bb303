"""How many live-update streams the inbox holds, so that open pages cannot fill its listener.

One principal (id and tenant) holds at most ``per_principal`` streams across all their sessions
(``approvals_ui.max_streams_per_principal``): their next one ends their own oldest, which is told it was
``superseded`` (that page then reloads on a timer instead). Everyone together holds at most ``max_open``
(``approvals_ui.max_streams``, at most half the listener's connections, the rest kept for page loads and
sign-ins): past that, a principal who holds one gives up their oldest, anyone else is refused. A stream never
ends another principal's.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from sidecar.contract import Principal
from sidecar.server.approvals_ui.places import to_end

__all__ = ["Slot", "StreamSlots"]


@dataclass(eq=False)
class Slot:
    """One open stream's place: ended (``end``) when it is superseded or the inbox stops."""

    owner: tuple[str, str]  # its principal's ``identity``
    superseded: bool = False
    _over: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def over(self) -> bool:
        return self._over.is_set()

    def end(self, *, superseded: bool = False) -> None:
        """Wake the stream so that it ends (telling its page it was ``superseded``, if so)."""
        self.superseded = self.superseded or superseded
        self._over.set()

    async def wait(self, seconds: float) -> None:
        """Return after ``seconds``, or at once when the slot is ended."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._over.wait(), seconds)


class StreamSlots:
    """The streams held per principal, oldest first, within both caps."""

    def __init__(self, *, max_open: int, per_principal: int) -> None:
        self._max_open, self._per_principal = max_open, per_principal
        self._held: dict[tuple[str, str], list[Slot]] = {}

    @property
    def open(self) -> int:
        return sum(len(slots) for slots in self._held.values())

    def held(self, principal: Principal) -> int:
        """How many streams ``principal`` holds."""
        return len(self._held.get(principal.identity, ()))

    def take(self, principal: Principal) -> Slot | None:
        """A place for a new stream of ``principal``, ending their own oldest when needed; ``None`` when every
        place is held by others."""
        mine = self._held.get(principal.identity, [])
        ended = to_end(mine, self.open, per_principal=self._per_principal, max_open=self._max_open)
        if ended is None:
            return None
        for superseded in ended:
            superseded.end(superseded=True)
        slot = Slot(principal.identity)
        self._held[slot.owner] = [*mine[len(ended):], slot]
        return slot

    def give_back(self, slot: Slot) -> None:
        """``slot``'s stream has ended, however it ended."""
        mine = self._held.get(slot.owner, [])
        if slot in mine:
            mine.remove(slot)
        if not mine:
            self._held.pop(slot.owner, None)

