"""The writes ``SqlStore`` group-commits (``sidecar.state.group``): a claim, an outcome statement, audit rows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sidecar.errors import StoreUnavailableError
from sidecar.state.chain import chained
from sidecar.state.driver import Deferred, Params, Row, Transaction
from sidecar.state.records import Claim
from sidecar.state.rows import operation_record
from sidecar.state.statements import StoreStatements

__all__ = ["AuditWrite", "ChainTail", "ClaimWrite", "StatementWrite", "found"]


def found(holder: list[Row], request_hash: str, legacy_hash: str | None) -> Claim:
    """The claim of a key held by the record ``holder`` (its request hash, then ``OPERATION_COLUMNS``): the same
    request if held for ``request_hash`` or ``legacy_hash``, else ``reused``."""
    held_for, *record = holder[0]
    return Claim(operation_record(tuple(record)), reused=held_for not in (request_hash, legacy_hash))


class ClaimWrite:
    """A claim inside a transaction no other writer comes between (SQLite): the insert, then the holder."""

    def __init__(self, sql: StoreStatements, key: tuple[str, ...], params: Params, request_hash: str,
                 legacy_hash: str | None) -> None:
        self._sql, self._key, self._params = sql, key, params
        self._hashes = request_hash, legacy_hash
        self._inserted, self._holder = Deferred(), Deferred()

    async def stage(self, tx: Transaction) -> None:
        self._inserted = await tx.later(self._sql.claim, self._params)
        self._holder = await tx.later(self._sql.holder, self._key)

    def result(self) -> Claim:
        if self._inserted.changed == 1:
            return Claim()
        if not self._holder.rows:  # cannot happen in one write transaction; never taken for a claim
            raise StoreUnavailableError(f"idempotency key {self._key[-1]!r} is neither free nor held")
        return found(self._holder.rows, *self._hashes)

    def failed(self) -> None:
        return None


class StatementWrite:
    """One statement (a completion, a release); its result is how many rows it changed."""

    def __init__(self, sql: str, params: Params) -> None:
        self._sql, self._params, self._done = sql, params, Deferred()

    async def stage(self, tx: Transaction) -> None:
        self._done = await tx.later(self._sql, self._params)

    def result(self) -> int:
        return self._done.changed

    def failed(self) -> None:
        return None


class ChainTail:
    """The chain a store appends to: its id, the hash its first link follows (``None``: the genesis), and
    whether other stores append to it too (``shared``: chain 1 of a SQLite file). The last hash of a chain of
    its own is kept (``last``) while every batch that linked to it committed; after one that rolled back it
    is read again, in the next batch's transaction."""

    def __init__(self, chain: int, start: str | None, *, shared: bool) -> None:
        self.chain, self.start, self.shared = chain, start, shared
        self.last, self.known = start, not shared


class AuditWrite:
    """Audit rows (``EVENT_COLUMNS``) linked after the last link of the store's chain. Only its store appends
    to a chain of its own, one batch at a time (its ``GroupCommit``), so no lock is needed; a shared chain's
    last hash is read in the same transaction, which holds the database's one write lock."""

    def __init__(self, sql: StoreStatements, rows: Sequence[Row], key: bytes | None, tail: ChainTail) -> None:
        self._sql, self._rows, self._key, self._tail = sql, rows, key, tail

    async def stage(self, tx: Transaction) -> None:
        last = None if self._tail.known else await tx.later(self._sql.last_audit_link, (self._tail.chain,))
        await tx.execute_many(self._sql.insert_audit, _linked(last, self._rows, self._key, self._tail))

    def result(self) -> None:
        self._tail.known = not self._tail.shared

    def failed(self) -> None:
        self._tail.known = False


def _linked(last: Deferred | None, rows: Sequence[Row], key: bytes | None, tail: ChainTail) -> Iterator[Row]:
    """``rows`` in ``tail``'s chain, linked after the hash ``last`` read (without a read, or if the chain has no
    link yet: ``tail.last``); read when the rows are first consumed, after it ran. ``tail.last`` follows."""
    if last is None:
        prev = tail.last
    else:
        prev = last.rows[0][1] if last.rows else tail.start  # the newest link's (id, hash)
    for row in chained(prev, rows, key):
        tail.last = row[-1]
        yield (tail.chain, *row)
