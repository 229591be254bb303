"""Helpers for hot-reload tests: change a watched file visibly, wait for a policy status."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from sidecar.client import AsyncClient
from sidecar.contract import ReloadStatus


def rewrite(path: Path, content: str | bytes) -> None:
    """Write ``content`` and move the mtime a second on, so a change shows even within one clock tick."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def until_status(client: AsyncClient, ready: Callable[[ReloadStatus], bool]) -> ReloadStatus:
    """Poll ``GetPolicyStatus`` until ``ready`` (about 5 s at most)."""
    for _ in range(250):
        status = await client.policy_status()
        if ready(status):
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"policy status never became ready: {status}")
