"""Policy sources the sidecar watches for hot reload.

A source says cheaply whether its content may have changed (``fingerprint``) and
compiles the current content into an engine (``load``). A policy directory or a
bundle file is fingerprinted by the size and modification time of its files; a
bundle URL by a conditional GET (``If-None-Match``); an engine over policies that
OPA manages itself has nothing here to watch.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.policy.compiling import compiled
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.files import PolicyFiles, check_files, policy_paths

if TYPE_CHECKING:  # bundles load their modules only when one is configured
    from sidecar.policy.bundle.fetch import BundleFetcher
    from sidecar.policy.bundle.signing import VerificationConfig

__all__ = ["BundleSource", "DirectorySource", "FixedSource", "Loader", "Serve"]

_WATCHED = ("*.rego", "*.json")

Loader = Callable[[], Awaitable[PolicyEngine]]
Serve = Callable[[PolicyFiles], Awaitable[PolicyEngine]]  # the configured engine over checked files


@dataclass(frozen=True)
class DirectorySource:
    """A policy directory (``*.rego`` and ``data.json``) and how to compile it."""

    root: Path
    loader: Loader

    @property
    def description(self) -> str:
        """``directory <root>``."""
        return f"directory {self.root}"

    async def fingerprint(self) -> str:
        """Path, size and modification time of every watched file."""
        return await asyncio.to_thread(_stat_fingerprint, self.root)

    async def load(self) -> PolicyEngine:
        """The loader's engine over the directory as it is now."""
        return await self.loader()


@dataclass(frozen=True)
class FixedSource:
    """Policies this sidecar does not own (e.g. bundles an OPA server manages): never reloaded here."""

    description: str
    loader: Loader

    async def fingerprint(self) -> str:
        """Always the same: nothing here changes."""
        return "fixed"

    async def load(self) -> PolicyEngine:
        """The loader's engine."""
        return await self.loader()


@dataclass
class BundleSource:
    """An OPA bundle, from a file or a URL, verified and checked here, then served by the configured engine."""

    description: str
    read: Callable[[], Awaitable[bytes | None]]  # the bundle's bytes, or None when unchanged
    verification: VerificationConfig | None
    serve: Serve
    _content: bytes = b""

    @classmethod
    def from_file(cls, path: Path, verification: VerificationConfig | None, serve: Serve) -> BundleSource:
        """A bundle file, read again only when its size or modification time changes."""
        seen: list[tuple[int, int]] = []

        def read_if_changed() -> bytes | None:
            """The file's bytes when its size or modification time changed (reading is for changes only)."""
            stat = path.stat()
            if seen == [(stat.st_size, stat.st_mtime_ns)]:
                return None
            seen[:] = [(stat.st_size, stat.st_mtime_ns)]
            return path.read_bytes()

        return cls(f"bundle {path}", lambda: asyncio.to_thread(read_if_changed), verification, serve)

    @classmethod
    def from_url(cls, fetcher: BundleFetcher, verification: VerificationConfig | None, serve: Serve) -> BundleSource:
        """A bundle URL, polled with conditional GETs."""
        async def read() -> bytes | None:
            return (await fetcher.fetch()).content

        return cls(f"bundle {fetcher.url}", read, verification, serve)

    async def fingerprint(self) -> str:
        """The SHA-256 of the bundle's bytes (kept for ``load``)."""
        content = await self.read()
        if content is not None:
            self._content = content
        return hashlib.sha256(self._content).hexdigest()

    async def load(self) -> PolicyEngine:
        """Verify and check the bundle last fingerprinted (off the event loop), then serve it."""
        return await self.serve(await compiled(self._checked, self._content))

    def _checked(self, content: bytes) -> PolicyFiles:
        from sidecar.policy.bundle.format import load_bundle

        bundle = load_bundle(content, self.verification, name=self.description.removeprefix("bundle "))
        return check_files(bundle.policy_files())


def _stat_fingerprint(root: Path) -> str:
    """Path, size and modification time of every watched file: no file is read."""
    if not root.is_dir():
        return "missing"
    digest = hashlib.sha256()
    for path in sorted({path for pattern in _WATCHED for path in policy_paths(root, pattern)}):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
