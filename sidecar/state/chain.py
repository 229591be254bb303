"""The audit hash chain: each stored event carries the hash of the one before it.

``hash`` is ``hmac-sha256:`` (keyed with ``audit.chain_key``, a secret kept out of the database)
or, with no key configured, ``sha256:`` over the canonical JSON of the event's fields plus
``prev_hash``. Without the key no one who can write the database can recompute a keyed link; an
unkeyed chain only shows accidental damage.

The log is a set of chains, one per store instance that appends (``ChainStart``; on SQLite, one writer
at a time, every store appends to chain 1, which also holds every event written before chains were per
instance). Only its store appends to a chain, one batch at a time, so each chain is linear and no lock is
shared. Chain 1's first event links to ``GENESIS_HASH``; a later chain's first event links to the newest
event of the log when it started (its ``link_hash``, also kept in its registration), so removing that
event shows. ``verify_store`` walks stored records in id order, each through the ``ChainVerifier`` of its
chain, and names the first link that does not hold: a changed event no longer matches its hash; a removed
or reordered one breaks the next ``prev_hash`` of its chain; an event of an unregistered chain, or a
chain start whose linked event is gone or changed, is a break too.
Columns added after the chain existed (``LATER_COLUMNS``) are hashed only when they hold a value, so the
links written before them still verify; clearing one of a newer event still breaks its link.
Unkeyed links may precede keyed ones (the key was configured later), never follow them, nor the keyed link a
chain starts after, nor a signed checkpoint's head.
Removing the newest events leaves a shorter valid chain: a signed checkpoint kept outside
the database (``sidecar.state.checkpoint``) notices that.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import astuple, dataclass, field, fields

from sidecar.canonical import MAX_SAFE_INTEGER, CanonicalizationError, canonical_bytes
from sidecar.state.driver import Row
from sidecar.state.records import AuditEvent, AuditRecord, ChainHead, ChainStart
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
_LINKED_COLUMNS = (*EVENT_COLUMNS, "prev_hash")
# (index in a linked row, its ``"name":`` prefix, whether ``None`` is left out), in canonical order: the names are
# ASCII, so their code-point order is JCS's
_SORTED_FIELDS = tuple((_LINKED_COLUMNS.index(name), f'"{name}":', name in LATER_COLUMNS)
                       for name in sorted(_LINKED_COLUMNS))
_encode_string: Callable[[str], str] = json.encoder.encode_basestring


def event_hash(row: Row, prev_hash: str, key: bytes | None = None) -> str:
    """The hash of an event (its values in ``EVENT_COLUMNS`` order) linked after ``prev_hash``:
    ``hmac-sha256:`` keyed with ``key``, or ``sha256:`` without one."""
    text = _linked_bytes(row, prev_hash)
    if key is None:
        return "sha256:" + hashlib.sha256(text).hexdigest()
    return KEYED_PREFIX + hmac.digest(key, text, "sha256").hex()


def _linked_bytes(row: Row, prev_hash: str) -> bytes:
    """The canonical JSON (``sidecar.canonical.canonical_bytes``) of the event's fields and ``prev_hash``, a
    ``LATER_COLUMNS`` field left out where it holds ``None``.

    An event holds strings, ``None`` and small integers: for those, the object is written here field by field,
    in the canonical (sorted) order, each string by Python's C encoder, which writes what ``canonical_bytes``
    writes (``tests/unit/test_canonical.py`` checks both agree); any other value takes ``canonical_bytes``."""
    if len(row) != len(EVENT_COLUMNS):
        raise ValueError(f"an event has {len(EVENT_COLUMNS)} fields, not {len(row)}")
    values = (*row, prev_hash)
    parts = []
    for index, prefix, optional in _SORTED_FIELDS:
        value = values[index]
        kind = type(value)
        if kind is str:
            parts.append(prefix + _encode_string(value))
        elif value is None:
            if not optional:
                parts.append(prefix + "null")
        elif kind is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            parts.append(prefix + str(value))
        else:
            return canonical_bytes({name: value for name, value in zip(_LINKED_COLUMNS, values, strict=True)
                                    if value is not None or name not in LATER_COLUMNS})
    try:
        return ("{" + ",".join(parts) + "}").encode()
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise CanonicalizationError(f"input contains non-UTF-8 codepoints: {exc.reason}") from None


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
    """Checks the records of one chain fed in id order. The first link follows ``start`` (``None``: the
    genesis). With ``key`` keyed links are checked (without it they cannot be); ``mark``: remember the hash
    of the ``mark``-th link (a checkpoint's position). Events from before the chain existed may only come
    first in a chain from the genesis, and unkeyed links only before keyed ones (a chain starting after a keyed
    link is keyed) and never after the ``mark``: the checkpoint was written with the key."""

    def __init__(self, key: bytes | None = None, *, mark: int | None = None, start: str | None = None) -> None:
        self.checked = 0
        self.unchained = 0
        self.unkeyed = 0
        self.last_hash: str | None = None
        self.marked: str | None = None
        self._key, self._mark, self._start = key, mark, start

    @classmethod
    def after(cls, head: ChainHead, key: bytes) -> ChainVerifier:
        """A verifier of the links after ``head`` (a checkpoint's, checked when it was written)."""
        verifier = cls(key, mark=head.count)
        verifier.checked, verifier.last_hash = head.count, head.hash
        return verifier

    @property
    def _sealed(self) -> bool:
        """Past the mark: every link is keyed."""
        return self._mark is not None and self.checked >= self._mark

    def feed(self, record: AuditRecord) -> ChainBreak | None:
        """Check ``record``, which must follow the ones fed before."""
        if record.hash is None and self.checked == 0 and self._start is None and not self._sealed:
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


    def _problem(self, record: AuditRecord) -> str | None:
        after = " or the checkpoint, written with the chain key, counts links before it" if self._sealed else ""
        if record.hash is None or record.prev_hash is None:
            return f"the event has no hash, but the links before it have{after}"
        if not _keyed(record.hash) and (self._sealed or _keyed(self.last_hash or self._start)):
            return (f"the event's hash is unkeyed but the links before it are keyed{after}: it was rewritten "
                    "without the chain key")
        if _keyed(record.hash) and self._key is None:
            return ("the event is keyed (hmac-sha256) and no chain key is configured (audit.chain_key or "
                    "audit.chain_key_file): it cannot be checked")
        expected_prev = self.last_hash or self._start or GENESIS_HASH
        if record.prev_hash != expected_prev:
            return (f"prev_hash {record.prev_hash} is not the hash of the event before it ({expected_prev}): "
                    "an event was removed, inserted or reordered")
        key = self._key if _keyed(record.hash) else None
        try:
            expected = event_hash(astuple(record.event), record.prev_hash, key)
        except CanonicalizationError as exc:
            return f"the event holds a value no event is written with ({exc}): the event was changed"
        if not hmac.compare_digest(expected.encode(), record.hash.encode()):
            return ("the event's fields do not match its hash: the event was changed"
                    + (" (or the chain key is not the one it was written with)" if key else ""))
        return None


def _keyed(digest: str | None) -> bool:
    return digest is not None and digest.startswith(KEYED_PREFIX)


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What ``verify_store`` found, over every chain: events checked, events from before the chain, the last
    good hash (of the newest event), the first broken link; links hashed without a key, whether a key checked
    the keyed ones; per chain its links checked (``counts``) and the hash of the link at the asked-for
    position (``marks``; absent if the chain is shorter)."""

    checked: int
    unchained: int
    last_hash: str | None
    broken: ChainBreak | None
    unkeyed: int = 0
    keyed: bool = False
    counts: Mapping[int, int] = field(default_factory=dict)
    marks: Mapping[int, str] = field(default_factory=dict)


class _LogVerifier:
    """The records of every chain, fed in id order, each checked by its chain's verifier."""

    def __init__(self, starts: Iterable[ChainStart], key: bytes | None, marks: Mapping[int, int] | None) -> None:
        self._key, self._marks = key, marks
        self._starts = {start.chain: start for start in starts}
        self._links: dict[int, list[ChainStart]] = {}
        for start in self._starts.values():
            if start.link_id is not None:
                self._links.setdefault(start.link_id, []).append(start)
        self._chains: dict[int, ChainVerifier] = {}
        self._last: str | None = None

    def feed(self, record: AuditRecord) -> ChainBreak | None:
        start = self._starts.get(record.chain)
        if start is None:
            return ChainBreak(record.id, f"the event is in chain {record.chain}, which is not registered: a chain's "
                                         "registration was removed")
        if record.chain not in self._chains:
            mark = None if self._marks is None else self._marks.get(record.chain, 0)
            self._chains[record.chain] = ChainVerifier(self._key, mark=mark, start=start.link_hash)
        if (broken := self._chains[record.chain].feed(record)) is not None:
            return broken
        for linked in self._links.pop(record.id, []):
            if linked.link_hash != record.hash:
                return ChainBreak(record.id, f"chain {linked.chain} starts after this event with hash "
                                             f"{linked.link_hash}, and it now has {record.hash}")
        self._last = record.hash or self._last
        return None

    def end(self) -> ChainBreak | None:
        """A chain start whose linked event was never fed: it was removed."""
        if not self._links:
            return None
        link_id = min(self._links)
        return ChainBreak(link_id, f"chain {self._links[link_id][0].chain} starts after event id {link_id}, which "
                                   "is missing: an event was removed")

    def report(self, broken: ChainBreak | None) -> ChainReport:
        chains = self._chains.values()
        return ChainReport(sum(c.checked for c in chains), sum(c.unchained for c in chains), self._last, broken,
                           sum(c.unkeyed for c in chains), self._key is not None,
                           {n: c.checked for n, c in self._chains.items()},
                           {n: c.marked for n, c in self._chains.items() if c.marked is not None})


async def verify_store(store: Store, *, page: int = 1000, key: bytes | None = None,
                       marks: Mapping[int, int] | None = None,
                       progress: Callable[[int], None] | None = None) -> ChainReport:
    """Walk ``store``'s audit chains, ``page`` records at a time, up to the first broken link; keyed links
    are checked with ``key``; per chain in ``marks`` (a checkpoint's), the hash of its link at that position is
    reported, and every later link, and every link of a chain not in ``marks``, must be keyed;
    ``progress`` is told the id of the last record of each page checked."""
    verifier = _LogVerifier(await store.audit_chains(), key, marks)
    after = 0
    while records := await store.audit_records(after_id=after, limit=page):
        for record in records:
            if (broken := verifier.feed(record)) is not None:
                return verifier.report(broken)
        after = records[-1].id
        if progress is not None:
            progress(after)
    return verifier.report(verifier.end())
