"""Policy sources the sidecar can watch: a directory of Rego files (bundles come next)."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.policy import PolicyEngine
from sidecar.policy.embedded import EmbeddedEngine

_WATCHED = ("*.rego", "*.json")


@dataclass(frozen=True)
class DirectorySource:
    """A policy directory (``*.rego`` and ``data.json``), compiled by the embedded engine."""

    root: Path
    description: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "description", f"directory {self.root}")

    async def fingerprint(self) -> str:
        return await asyncio.to_thread(_stat_fingerprint, self.root)

    async def load(self) -> PolicyEngine:
        return await asyncio.to_thread(EmbeddedEngine.load, self.root)


def _stat_fingerprint(root: Path) -> str:
    """Path, size and modification time of every watched file: no file is read."""
    digest = hashlib.sha256()
    files = sorted({path for pattern in _WATCHED for path in root.rglob(pattern)}) if root.is_dir() else []
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest() if root.is_dir() else "missing"
