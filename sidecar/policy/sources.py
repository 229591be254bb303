"""Policy sources the sidecar watches for hot reload.

A source says cheaply whether its content may have changed (``fingerprint``) and
compiles the current content into an engine (``load``). A policy directory is
fingerprinted by the size and modification time of its files; an engine over
policies that OPA manages itself has nothing here to watch.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sidecar.policy import PolicyEngine

_WATCHED = ("*.rego", "*.json")

Loader = Callable[[], Awaitable[PolicyEngine]]


@dataclass(frozen=True)
class DirectorySource:
    """A policy directory (``*.rego`` and ``data.json``) and how to compile it."""

    root: Path
    loader: Loader

    @property
    def description(self) -> str:
        return f"directory {self.root}"

    async def fingerprint(self) -> str:
        return await asyncio.to_thread(_stat_fingerprint, self.root)

    async def load(self) -> PolicyEngine:
        return await self.loader()


@dataclass(frozen=True)
class FixedSource:
    """Policies this sidecar does not own (e.g. bundles an OPA server manages): never reloaded here."""

    description: str
    loader: Loader

    async def fingerprint(self) -> str:
        return "fixed"

    async def load(self) -> PolicyEngine:
        return await self.loader()


def _stat_fingerprint(root: Path) -> str:
    """Path, size and modification time of every watched file: no file is read."""
    if not root.is_dir():
        return "missing"
    digest = hashlib.sha256()
    for path in sorted({path for pattern in _WATCHED for path in root.rglob(pattern)}):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
