"""The audit hash chain: each stored event carries the hash of the one before it.

``hash`` is ``sha256:`` over the canonical JSON of the event's fields plus ``prev_hash``;
the first event links to ``GENESIS_HASH``. A store appends under a lock (``chained`` inside
its write transaction), so one store's chain is linear whoever writes. ``ChainVerifier``
walks stored records in id order and names the first link that does not hold: a changed
event no longer matches its hash; a removed or reordered one breaks the next ``prev_hash``.
Removing the newest events leaves a shorter valid chain: compare counts or the last hash
with an exported copy to notice that.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import astuple, dataclass, fields

from sidecar.canonical import sha256_hex
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent, AuditRecord
from sidecar.state.store import Store

__all__ = [
    "EVENT_COLUMNS",
    "GENESIS_HASH",
    "ChainBreak",
    "ChainReport",
    "ChainVerifier",
    "chained",
    "event_hash",
    "verify_store",
]

GENESIS_HASH = "sha256:" + "0" * 64
EVENT_COLUMNS = tuple(f.name for f in fields(AuditEvent))


def event_hash(row: Row, prev_hash: str) -> str:
    """The hash of an event (its values in ``EVENT_COLUMNS`` order) linked after ``prev_hash``."""
    return sha256_hex({**dict(zip(EVENT_COLUMNS, row, strict=True)), "prev_hash": prev_hash})


def chained(last_hash: str | None, rows: Iterable[Row]) -> Iterator[Row]:
    """``rows`` (events in ``EVENT_COLUMNS`` order) each extended by ``prev_hash`` and ``hash``, linked in order.

    Lazy: the hashing happens as the rows are consumed (on SQLite, on the store's worker thread).
    """
    prev = last_hash or GENESIS_HASH
    for row in rows:
        digest = event_hash(row, prev)
        yield (*row, prev, digest)
        prev = digest


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first link that does not hold."""

    id: int
    problem: str


class ChainVerifier:
    """Checks records fed in id order; events from before the chain existed may only come first."""

    def __init__(self) -> None:
        self.checked = 0
        self.unchained = 0
        self.last_hash: str | None = None

    def feed(self, record: AuditRecord) -> ChainBreak | None:
        """Check ``record``, which must follow the ones fed before."""
        if record.hash is None and self.checked == 0:
            self.unchained += 1
            return None
        problem = self._problem(record)
        if problem is None:
            self.checked += 1
            self.last_hash = record.hash
            return None
        return ChainBreak(record.id, problem)

    def report(self, broken: ChainBreak | None) -> ChainReport:
        """What was found, ``broken`` being the first bad link if any."""
        return ChainReport(self.checked, self.unchained, self.last_hash, broken)

    def _problem(self, record: AuditRecord) -> str | None:
        if record.hash is None or record.prev_hash is None:
            return "the event has no hash, but events before it have"
        expected_prev = self.last_hash or GENESIS_HASH
        if record.prev_hash != expected_prev:
            return (f"prev_hash {record.prev_hash} is not the hash of the event before it ({expected_prev}): "
                    "an event was removed, inserted or reordered")
        if event_hash(astuple(record.event), record.prev_hash) != record.hash:
            return "the event's fields do not match its hash: the event was changed"
        return None


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What ``verify_store`` found: events checked, events from before the chain, the last good hash."""

    checked: int
    unchained: int
    last_hash: str | None
    broken: ChainBreak | None


async def verify_store(store: Store, *, page: int = 1000) -> ChainReport:
    """Walk ``store``'s audit chain, ``page`` records at a time, up to its first broken link."""
    verifier = ChainVerifier()
    after = 0
    while records := await store.audit_records(after_id=after, limit=page):
        for record in records:
            if (broken := verifier.feed(record)) is not None:
                return verifier.report(broken)
        after = records[-1].id
    return verifier.report(None)
