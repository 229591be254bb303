"""A directory laid out as the kubelet projects a ConfigMap or Secret volume into a pod.

Each version of the volume is a hidden directory ``..<timestamp>``; ``..data`` is a symlink to the current
one, swapped atomically (a rename) on an update; every key is a visible symlink ``KEY -> ..data/KEY``.
Between writing a new version and removing the old one, both versions' directories exist.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

__all__ = ["project"]

_versions = itertools.count(1)


def project(root: Path, files: Mapping[str, str | bytes], *, keep_old: bool = False) -> Path:
    """Write ``files`` as the next version of the volume at ``root``; the old version's directory is removed
    unless ``keep_old`` (an update caught half way). Returns the new version's directory."""
    root.mkdir(parents=True, exist_ok=True)
    old = [entry for entry in root.iterdir() if entry.name.startswith("..") and entry.name != "..data"
           and not entry.is_symlink()]
    version = root / f"..2026_01_01_00_00_{next(_versions):02d}.{os.getpid()}"
    version.mkdir()
    for name, content in files.items():
        target = version / name
        target.write_bytes(content.encode() if isinstance(content, str) else content)
    swap = root / "..data_tmp"
    swap.symlink_to(version.name)
    swap.rename(root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for link in root.iterdir():
        if not link.name.startswith("..") and link.name not in files:
            link.unlink()  # a key the new version no longer has
    for stale in [] if keep_old else old:
        shutil.rmtree(stale)
    return version
