"""Signed checkpoints of the audit chain, kept outside the database, so that removing the newest events shows.

A checkpoint is the chain's head at one moment: how many links it had (``count``), the newest one's
id and hash, and when; HMAC-SHA256-signed with the chain key (``audit.chain_key``). The sidecar
writes it to ``audit.checkpoint_file`` (atomically: a temporary file renamed over it, owner-only)
at an interval and at shutdown (``Checkpointer``). ``audit verify`` reads it back (``read_checkpoint``:
a signature that fails is an error) and compares the chain with it (``compare``): the chain must
still hold at least ``count`` links and its ``count``-th must be the checkpoint's head.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sidecar.canonical import canonical_bytes
from sidecar.state.chain import ChainReport
from sidecar.state.store import Store

__all__ = ["Checkpoint", "CheckpointError", "Checkpointer", "compare", "read_checkpoint", "write_checkpoint"]

log = logging.getLogger("toolbooth.audit")
_VERSION = 1


class CheckpointError(Exception):
    """The checkpoint file cannot be read, is malformed, or its signature fails."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The chain's head when it was written: ``count`` links, the newest ``head_id`` with hash ``head``."""

    count: int
    head_id: int
    head: str
    written_at: str


def _signature(checkpoint: Checkpoint, key: bytes) -> str:
    body = canonical_bytes({"version": _VERSION, **asdict(checkpoint)})
    return "hmac-sha256:" + hmac.new(key, body, hashlib.sha256).hexdigest()


def write_checkpoint(path: Path, checkpoint: Checkpoint, key: bytes) -> None:
    """Write ``checkpoint`` signed with ``key`` to ``path``, replacing it atomically (mode 0600)."""
    data = {"version": _VERSION, **asdict(checkpoint), "signature": _signature(checkpoint, key)}
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
        checkpoint = Checkpoint(int(data["count"]), int(data["head_id"]), str(data["head"]), str(data["written_at"]))
        signature = str(data["signature"])
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"the checkpoint {path} is malformed: {exc!r}") from None
    if data.get("version") != _VERSION or not hmac.compare_digest(signature.encode(),
                                                                   _signature(checkpoint, key).encode()):
        raise CheckpointError(f"the checkpoint {path} has a signature that fails under the chain key: it was "
                              "altered, or written with another key")
    return checkpoint


def compare(report: ChainReport, checkpoint: Checkpoint) -> str | None:
    """What the (intact) chain of ``report``, walked with ``mark=checkpoint.count``, contradicts in
    ``checkpoint``; ``None`` if the checkpoint's head is where it counts it."""
    where = (f"the checkpoint of {checkpoint.written_at} counts {checkpoint.count} event(s), "
             f"head id {checkpoint.head_id}")
    if report.checked < checkpoint.count:
        return f"events removed after the checkpoint: {where}; the log holds {report.checked}"
    if report.marked != checkpoint.head:
        return (f"events removed after the checkpoint: {where}, hash {checkpoint.head}, but the log's event "
                f"{checkpoint.count} has hash {report.marked} (head not found: the log was cut and rewritten)")
    return None


class Checkpointer:
    """Writes the checkpoint of ``store``'s chain to ``path``, signed with ``key``."""

    def __init__(self, store: Store, key: bytes, path: Path) -> None:
        self.store, self.path = store, path
        self._key = key

    async def write(self) -> Checkpoint | None:
        """Write queued events, then the checkpoint of the chain's head (none while the chain is empty)."""
        await self.store.flush_audit()
        head = await self.store.audit_head()
        if head is None:
            return None
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        checkpoint = Checkpoint(head.count, head.id, head.hash, now)
        await asyncio.to_thread(write_checkpoint, self.path, checkpoint, self._key)
        return checkpoint

    async def try_write(self) -> None:
        """``write``, a failure logged (never raised): the calls go on whatever happens to the file."""
        try:
            await self.write()
        except Exception as exc:  # noqa: BLE001 - a store or file failure: logged, the next write tries again
            log.error("the audit checkpoint %s could not be written: %s", self.path, exc)

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """``try_write`` every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if not stop.is_set():
                await self.try_write()
