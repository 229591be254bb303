"""The heads of the audit chains a checkpoint signs, each extending the head of the checkpoint before it.

``extend`` walks each registered chain on from its head in the earlier checkpoint: that head must still be in
the log, with its hash, and every link after it must hold under the chain key and be keyed, as must every link
of a chain the earlier checkpoint does not cover. Without an earlier checkpoint every chain is checked from its
start (unkeyed links may come first: the key was configured later). A chain that went backwards (its head
removed), was rewritten or lost its key or its hashes is the ``ChainBreak`` it shows: nothing is signed over it.
Only a chain's own store appends to it, so its links commit in id order and a walk reads a prefix of it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.state.chain import ChainBreak, ChainVerifier
from sidecar.state.records import ChainHead, ChainStart
from sidecar.state.store import Store

__all__ = ["extend"]


async def extend(store: Store, key: bytes, before: Sequence[ChainHead] | None, *,
                 page: int = 1000) -> list[ChainHead] | ChainBreak:
    """The newest link of each chain with links and the number of links up to it, checked with ``key`` on from
    the heads ``before`` (an earlier checkpoint's; ``None``: there is none); the first link that does not hold
    instead."""
    starts = await store.audit_chains()
    registered = {start.chain for start in starts}
    known = {head.chain: head for head in before or ()}
    for head in known.values():
        if head.chain not in registered:
            return ChainBreak(head.id, f"chain {head.chain}, which the checkpoint counts, is no longer registered")
    heads = []
    for start in starts:
        walked = await _walk(store, key, start, known.get(start.chain), sealed=before is not None, page=page)
        if isinstance(walked, ChainBreak):
            return walked
        if walked is not None:
            heads.append(walked)
    return heads


async def _walk(store: Store, key: bytes, start: ChainStart, head: ChainHead | None, *, sealed: bool,
                page: int) -> ChainHead | ChainBreak | None:
    """Chain ``start``'s head, its links checked on from ``head`` (``None``: from its first, all keyed if
    ``sealed``); ``None`` if it has no links."""
    chain = start.chain
    if head is None:
        verifier, newest = ChainVerifier(key, mark=0 if sealed else None, start=start.link_hash), 0
    else:
        found = await store.audit_chain_records(chain, after_id=head.id - 1, limit=1)
        if not found or (found[0].id, found[0].hash) != (head.id, head.hash):
            return ChainBreak(head.id, f"the checkpoint's head of chain {chain} (link {head.count}, event id "
                                       f"{head.id}, hash {head.hash}) is no longer in the log: events were removed "
                                       "or rewritten")
        verifier, newest = ChainVerifier.after(head, key), head.id
    while records := await store.audit_chain_records(chain, after_id=newest, limit=page):
        for record in records:
            if (broken := verifier.feed(record)) is not None:
                return broken
            newest = record.id
    if verifier.last_hash is None:
        return None
    return ChainHead(newest, verifier.last_hash, verifier.checked, chain)
