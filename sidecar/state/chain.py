"""The audit hash chain: each stored event carries the hash of the one before it.

``hash`` is ``hmac-sha256:`` (keyed with ``audit.chain_key``, a secret kept out of the database)
or, with no key configured, ``sha256:`` over the canonical JSON of the event's fields plus
``prev_hash``; the first event links to ``GENESIS_HASH``. Without the key no one who can write the
database can recompute a keyed link; an unkeyed chain only shows accidental damage. A store
appends under a lock (``chained`` inside its write transaction), so one store's chain is linear
whoever writes. ``ChainVerifier`` walks stored records in id order and names the first link that
does not hold: a changed event no longer matches its hash; a removed or reordered one breaks
the next ``prev_hash``.
Columns added after the chain existed (``LATER_COLUMNS``) are hashed only when they hold a value, so the
links written before them still verify; clearing one of a newer event still breaks its link.
Unkeyed links may precede keyed ones (the key was configured later), never follow them.
Removing the newest events leaves a shorter valid chain: a signed checkpoint kept outside
the database (``sidecar.state.checkpoint``) notices that.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass, fields

from sidecar.canonical import canonical_bytes, sha256_hex
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent, AuditRecord
from sidecar.state.store import Store

__all__ = [
    "EVENT_COLUMNS",
    "GENESIS_HASH",
    "KEYED_PREFIX",
    "LATER_COLUMNS",
    "ChainBreak",
    "ChainReport",
    "ChainVerifier",
    "chained",
    "event_hash",
    "verify_store",
]

GENESIS_HASH = "sha256:" + "0" * 64
KEYED_PREFIX = "hmac-sha256:"
EVENT_COLUMNS = tuple(f.name for f in fields(AuditEvent))
LATER_COLUMNS = frozenset({"decision_ids", "decision_input"})  # added after the chain: hashed only when set


def event_hash(row: Row, prev_hash: str, key: bytes | None = None) -> str:
    """The hash of an event (its values in ``EVENT_COLUMNS`` order) linked after ``prev_hash``:
    ``hmac-sha256:`` keyed with ``key``, or ``sha256:`` without one."""
    linked = {name: value for name, value in zip(EVENT_COLUMNS, row, strict=True)
              if value is not None or name not in LATER_COLUMNS}
    linked["prev_hash"] = prev_hash
    if key is None:
        return sha256_hex(linked)
    return KEYED_PREFIX + hmac.new(key, canonical_bytes(linked), hashlib.sha256).hexdigest()


def chained(last_hash: str | None, rows: Iterable[Row], key: bytes | None = None) -> Iterator[Row]:
    """``rows`` (events in ``EVENT_COLUMNS`` order) each extended by ``prev_hash`` and ``hash`` (keyed with
    ``key`` if given), linked in order.

    Lazy: the hashing happens as the rows are consumed (on SQLite, on the store's worker thread).
    """
    prev = last_hash or GENESIS_HASH
    for row in rows:
        digest = event_hash(row, prev, key)
        yield (*row, prev, digest)
        prev = digest


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """The first link that does not hold."""

    id: int
    problem: str


class ChainVerifier:
    """Checks records fed in id order; events from before the chain existed may only come first, and
    unkeyed links only before keyed ones. With ``key`` keyed links are checked (without it they cannot be);
    ``mark``: remember the hash of the ``mark``-th link (a checkpoint's position)."""

    def __init__(self, key: bytes | None = None, *, mark: int | None = None) -> None:
        self.checked = 0
        self.unchained = 0
        self.unkeyed = 0
        self.last_hash: str | None = None
        self.marked: str | None = None
        self._key, self._mark = key, mark

    def feed(self, record: AuditRecord) -> ChainBreak | None:
        """Check ``record``, which must follow the ones fed before."""
        if record.hash is None and self.checked == 0:
            self.unchained += 1
            return None
        problem = self._problem(record)
        if problem is None:
            self.checked += 1
            self.unkeyed += not _keyed(record.hash)
            self.last_hash = record.hash
            if self.checked == self._mark:
                self.marked = record.hash
            return None
        return ChainBreak(record.id, problem)

    def report(self, broken: ChainBreak | None) -> ChainReport:
        """What was found, ``broken`` being the first bad link if any."""
        return ChainReport(self.checked, self.unchained, self.last_hash, broken, self.unkeyed, self._key is not None,
                           self.marked)

    def _problem(self, record: AuditRecord) -> str | None:
        if record.hash is None or record.prev_hash is None:
            return "the event has no hash, but events before it have"
        if _keyed(self.last_hash) and not _keyed(record.hash):
            return ("the event's hash is unkeyed but events before it are keyed: it was rewritten without the "
                    "chain key")
        if _keyed(record.hash) and self._key is None:
            return ("the event is keyed (hmac-sha256) and no chain key is configured (audit.chain_key or "
                    "audit.chain_key_file): it cannot be checked")
        expected_prev = self.last_hash or GENESIS_HASH
        if record.prev_hash != expected_prev:
            return (f"prev_hash {record.prev_hash} is not the hash of the event before it ({expected_prev}): "
                    "an event was removed, inserted or reordered")
        key = self._key if _keyed(record.hash) else None
        expected = event_hash(astuple(record.event), record.prev_hash, key)
        if not hmac.compare_digest(expected.encode(), record.hash.encode()):
            return ("the event's fields do not match its hash: the event was changed"
                    + (" (or the chain key is not the one it was written with)" if key else ""))
        return None


def _keyed(digest: str | None) -> bool:
    return digest is not None and digest.startswith(KEYED_PREFIX)


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What ``verify_store`` found: events checked, events from before the chain, the last good hash, the
    first broken link; links hashed without a key, whether a key checked the keyed ones, the hash of the
    link at the asked-for position (``None`` if the chain is shorter)."""

    checked: int
    unchained: int
    last_hash: str | None
    broken: ChainBreak | None
    unkeyed: int = 0
    keyed: bool = False
    marked: str | None = None


async def verify_store(store: Store, *, page: int = 1000, key: bytes | None = None,
                       mark: int | None = None, progress: Callable[[int], None] | None = None) -> ChainReport:
    """Walk ``store``'s audit chain, ``page`` records at a time, up to its first broken link; keyed links
    are checked with ``key``; the hash of the ``mark``-th link is reported; ``progress`` is told the id of
    the last record of each page checked."""
    verifier = ChainVerifier(key, mark=mark)
    after = 0
    while records := await store.audit_records(after_id=after, limit=page):
        for record in records:
            if (broken := verifier.feed(record)) is not None:
                return verifier.report(broken)
        after = records[-1].id
        if progress is not None:
            progress(after)
    return verifier.report(None)
