"""Random identifiers of calls and decisions: version 4 UUIDs from the operating system's CSPRNG, read in blocks.

A call takes four of them (its request id, one per policy decision). ``os.urandom`` for each is a system call
that lets go of the GIL, and on a busy sidecar every such release hands the GIL to another thread (the
store's writer, gRPC's poller, the span exporter), which the event loop then waits for. So the bytes are
read 4 KiB at a time and handed out 16 at a time; a forked child starts with none of its parent's.
"""

from __future__ import annotations

import os

__all__ = ["random_uuid", "random_uuid_hex"]

_BLOCK = 4096
_VARIANT = "89ab"


class _Bytes:
    """Random bytes read ahead from ``os.urandom``, each handed out once."""

    __slots__ = ("_block", "_next")

    def __init__(self) -> None:
        self._block, self._next = b"", _BLOCK

    def take16(self) -> bytes:
        start = self._next
        if start >= len(self._block):
            self._block, start = os.urandom(_BLOCK), 0
        self._next = start + 16
        return self._block[start:start + 16]

    def forget(self) -> None:
        self._block, self._next = b"", _BLOCK


_bytes = _Bytes()
os.register_at_fork(after_in_child=_bytes.forget)


def random_uuid_hex() -> str:
    """A random UUID (version 4), as ``uuid.uuid4().hex`` writes it."""
    h = _bytes.take16().hex()
    return f"{h[:12]}4{h[13:16]}{_VARIANT[int(h[16], 16) & 3]}{h[17:]}"


def random_uuid() -> str:
    """A random UUID (version 4), as ``str(uuid.uuid4())`` writes it."""
    h = random_uuid_hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
