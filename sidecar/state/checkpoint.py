"""Signed checkpoints of the audit chain, kept outside the database, so that removing the newest events shows.

A checkpoint is the head of every chain of the log at one moment: per chain how many links it had
(``count``), the newest one's id and hash; and when; HMAC-SHA256-signed with the chain key
(``audit.chain_key``). The sidecar writes it to ``audit.checkpoint_file`` (atomically: a temporary file
renamed over it, owner-only) at an interval and at shutdown (``Checkpointer``), each one extending the
one before it: the links since its heads are checked with the key (``sidecar.state.heads``), and a log that
does not extend it is never signed. ``audit verify`` reads it back (``read_checkpoint``: a signature that
fails is an error) and compares the chains with it (``compare``): each chain must still hold at least
``count`` links and its ``count``-th must be the checkpoint's head of it. A version 1 file (from before
chains were per store instance) holds one head, of chain 1, where every older event is.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.canonical import canonical_bytes
from sidecar.state.chain import ChainBreak, ChainReport
from sidecar.state.heads import extend
from sidecar.state.records import ChainHead
from sidecar.state.store import Store

__all__ = ["Checkpoint", "CheckpointError", "Checkpointer", "compare", "read_checkpoint", "write_checkpoint"]

log = logging.getLogger("toolbooth.audit")
_VERSION = 2


class CheckpointError(Exception):
    """The checkpoint file cannot be read, is malformed, or its signature fails; or the log does not extend it."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The heads of the chains when it was written: per chain ``count`` links, the newest with id ``id`` and
    hash ``hash``."""

    heads: tuple[ChainHead, ...]
    written_at: str

    @property
    def count(self) -> int:
        """Links of every chain together."""
        return sum(head.count for head in self.heads)

    @property
    def head_id(self) -> int:
        """The id of the newest head."""
        return max(head.id for head in self.heads)

    @property
    def marks(self) -> dict[int, int]:
        """Per chain, the position of its head (``verify_store``'s ``marks``)."""
        return {head.chain: head.count for head in self.heads}


def _body(checkpoint: Checkpoint, version: int) -> dict[str, Any]:
    if version == 1:
        [head] = checkpoint.heads
        return {"version": 1, "count": head.count, "head_id": head.id, "head": head.hash,
                "written_at": checkpoint.written_at}
    chains = [{"chain": h.chain, "count": h.count, "head_id": h.id, "head": h.hash} for h in checkpoint.heads]
    return {"version": version, "chains": chains, "written_at": checkpoint.written_at}


def _signature(checkpoint: Checkpoint, key: bytes, version: int = _VERSION) -> str:
    body = canonical_bytes(_body(checkpoint, version))
    return "hmac-sha256:" + hmac.new(key, body, hashlib.sha256).hexdigest()


def write_checkpoint(path: Path, checkpoint: Checkpoint, key: bytes) -> None:
    """Write ``checkpoint`` signed with ``key`` to ``path``, replacing it atomically (mode 0600)."""
    data = {**_body(checkpoint, _VERSION), "signature": _signature(checkpoint, key)}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(json.dumps(data, indent=2) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def read_checkpoint(path: Path, key: bytes) -> Checkpoint:
    """The checkpoint at ``path`` if its signature holds under ``key``; ``CheckpointError`` otherwise."""
    try:
        data: Any = json.loads(path.read_text())
        version = data.get("version")
        chains = [{"chain": 1, **data}] if version == 1 else data["chains"]
        heads = tuple(ChainHead(int(c["head_id"]), str(c["head"]), int(c["count"]), int(c["chain"])) for c in chains)
        checkpoint = Checkpoint(heads, str(data["written_at"]))
        signature = str(data["signature"])
        if not heads:
            raise ValueError("no chain heads")
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"the checkpoint {path} is malformed: {exc!r}") from None
    if version not in (1, _VERSION) or not hmac.compare_digest(signature.encode(),
                                                               _signature(checkpoint, key, version).encode()):
        raise CheckpointError(f"the checkpoint {path} has a signature that fails under the chain key: it was "
                              "altered, or written with another key")
    return checkpoint


def compare(report: ChainReport, checkpoint: Checkpoint) -> str | None:
    """What the (intact) chains of ``report``, walked with ``marks=checkpoint.marks``, contradict in
    ``checkpoint``; ``None`` if each chain's head is where the checkpoint counts it."""
    for head in checkpoint.heads:
        where = (f"the checkpoint of {checkpoint.written_at} counts {head.count} event(s) in chain {head.chain}, "
                 f"head id {head.id}")
        held = report.counts.get(head.chain, 0)
        if held < head.count:
            return f"events removed after the checkpoint: {where}; the log holds {held}"
        if report.marks.get(head.chain) != head.hash:
            return (f"events removed after the checkpoint: {where}, hash {head.hash}, but the chain's event "
                    f"{head.count} has hash {report.marks.get(head.chain)} (head not found: the log was cut and "
                    "rewritten)")
    return None


class Checkpointer:
    """Writes the checkpoint of ``store``'s chains to ``path``, signed with ``key``, each one extending the one
    before it: the last one this process wrote, and the one in the file (at start, the file's alone)."""

    def __init__(self, store: Store, key: bytes, path: Path) -> None:
        self.store, self.path = store, path
        self._key = key
        self._last: Checkpoint | None = None  # the last one written: the next one counts on from its heads

    async def write(self) -> Checkpoint | None:
        """Write queued events, then the checkpoint of the chains' heads (none while the log has no links).

        ``CheckpointError``, nothing signed, if the log does not extend the checkpoint before it, or the file holds
        one that is not valid and this process wrote none; then the file keeps (or gets back) the last one
        this process wrote.
        """
        await self.store.flush_audit()
        on_file, last = await asyncio.to_thread(self._on_file), self._last
        replaced = last if last is not None and on_file != last else None
        if replaced is not None:
            log.warning("the audit checkpoint %s is not the one this sidecar wrote last: it was replaced or "
                        "removed", self.path)
        before = list(dict.fromkeys(c for c in (last, on_file) if c is not None))
        try:
            heads = await self._extend(before[0] if before else None)
            for other in before[1:]:
                await self._extend(other)
        except CheckpointError:
            if replaced is not None:  # the newest checkpoint signed stays the one on file
                await asyncio.to_thread(write_checkpoint, self.path, replaced, self._key)
            raise
        if not heads:
            return None
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        checkpoint = Checkpoint(tuple(heads), now)
        await asyncio.to_thread(write_checkpoint, self.path, checkpoint, self._key)
        self._last = checkpoint
        return checkpoint

    def _on_file(self) -> Checkpoint | None:
        """The checkpoint in the file (``None``: none, or one not valid while this process wrote one)."""
        if not self.path.exists():
            return None
        try:
            return read_checkpoint(self.path, self._key)
        except CheckpointError as exc:
            if self._last is None:
                raise CheckpointError(f"{exc}; it is kept as it is, and nothing is signed after it") from None
            return None

    async def _extend(self, before: Checkpoint | None) -> list[ChainHead]:
        """The chains' heads, extending ``before``; ``CheckpointError`` if the log does not."""
        extended = await extend(self.store, self._key, None if before is None else before.heads)
        if not isinstance(extended, ChainBreak):
            return extended
        since = "its start" if before is None else f"the checkpoint of {before.written_at}"
        raise CheckpointError(f"the audit log does not extend {since}: event id {extended.id}: {extended.problem} "
                              "(toolbooth audit verify shows it)")

    async def try_write(self) -> None:
        """``write``, a failure logged (never raised): the calls go on whatever happens to the file."""
        try:
            await self.write()
        except Exception as exc:  # noqa: BLE001 - a store or file failure: logged, the next write tries again
            log.error("audit checkpoint not written to %s: %s", self.path, exc)

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """``try_write`` every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if not stop.is_set():
                await self.try_write()
