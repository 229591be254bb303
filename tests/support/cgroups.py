"""A fake ``/`` for ``sidecar.config.cpus``: ``/proc/self/cgroup``, ``/proc/self/mountinfo`` and cgroup files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["V1_MOUNT", "V2_MOUNT", "fake_root"]

V2_MOUNT = "/sys/fs/cgroup"
V1_MOUNT = "/sys/fs/cgroup/cpu,cpuacct"


def fake_root(root: Path, *, v2: str | None = None, v1: str | None = None, files: Mapping[str, str] | None = None,
              v2_mount: str = V2_MOUNT, mount_root: str = "/") -> Path:
    """``root`` as a host whose process is in cgroup ``v2`` (the ``0::`` line, the ``cgroup2`` mount at ``v2_mount``)
    and/or ``v1`` (the ``cpu,cpuacct`` controller's, mounted at ``V1_MOUNT``), each mount showing the cgroup
    ``mount_root``; ``files``: paths under ``root`` (e.g. ``/sys/fs/cgroup/pod/cpu.max``) and their text. The
    process's cgroup directories exist; files not named do not."""
    lines, mounts = [], []
    if v1 is not None:
        lines.append(f"4:cpu,cpuacct:{v1}")
        mounts.append(f"32 25 0:29 {mount_root} {V1_MOUNT} rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct")
        _directory(root, V1_MOUNT, v1, mount_root)
    if v2 is not None:
        lines.append(f"0::{v2}")
        mounts.append(f"30 25 0:26 {mount_root} {v2_mount.replace(' ', chr(92) + '040')} rw,nosuid shared:4 - "
                      "cgroup2 cgroup2 rw,nsdelegate")
        _directory(root, v2_mount, v2, mount_root)
    _write(root, "/proc/self/cgroup", "".join(f"{line}\n" for line in lines))
    _write(root, "/proc/self/mountinfo", "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                                         + "".join(f"{mount}\n" for mount in mounts))
    for path, text in (files or {}).items():
        _write(root, path, text)
    return root


def _directory(root: Path, mount: str, cgroup: str, mount_root: str) -> None:
    below = cgroup.removeprefix(mount_root.rstrip("/")) if cgroup.startswith(mount_root) else ""
    (root / mount.lstrip("/") / below.lstrip("/")).mkdir(parents=True, exist_ok=True)


def _write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
