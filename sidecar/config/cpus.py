"""How many CPUs this process may use, for ``server.workers: auto``: its cgroup's CPU limit, not the host's cores.

Read as the JVM (since JDK 23, which also walks up the hierarchy) and .NET read it; Go's automaxprocs reads only
the process's own cgroup and rounds down:

1. **cgroup v2**: ``cpu.max`` (``QUOTA PERIOD`` in microseconds; ``max``: no limit) of the process's cgroup (the
   ``0::`` line of ``/proc/self/cgroup``, under the ``cgroup2`` mount of ``/proc/self/mountinfo``) and of every
   cgroup above it up to that mount: the smallest limit on the path, since a parent's binds its children (a
   pod's limit sits above its container's). A cgroup without the file has no limit of its own.
2. Else **cgroup v1**: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota ``-1``: no limit) along the same path
   in the mount of the ``cpu`` controller.
3. The CPUs it may run on: its affinity (``os.sched_getaffinity``: a cpuset, ``taskset``), else
   ``os.cpu_count()``.

The count is the smaller of the cgroup limit and the CPUs it may run on, a fraction rounded up (1.5 CPUs: 2), at
least 1. A file that cannot be read or parsed makes its source unusable (logged at DEBUG) and the next one is
used: reading never raises. ``root`` stands for ``/`` (tests point it at a fake tree).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuCount", "CpuLimit", "cgroup_limit", "online_cpus", "usable_cpus"]

log = logging.getLogger(__name__)

_V2_FILE = "cpu.max"
_V1_QUOTA, _V1_PERIOD = "cpu.cfs_quota_us", "cpu.cfs_period_us"


class _Unusable(Exception):
    """A source whose files cannot be read or parsed: the next source is used."""


@dataclass(frozen=True)
class CpuCount:
    """How many CPUs this process may use (whole, at least 1) and where that number came from."""

    cpus: int
    source: str


@dataclass(frozen=True)
class CpuLimit:
    """A cgroup's limit: ``quota`` microseconds of CPU time every ``period``, set in ``file``."""

    quota: int
    period: int
    file: str  # as the process sees it, e.g. /sys/fs/cgroup/kubepods/pod1/cpu.max

    @property
    def cpus(self) -> int:
        """The limit in whole CPUs, rounded up."""
        return max(1, -(-self.quota // self.period))

    def __str__(self) -> str:
        fraction = f", {self.quota / self.period:g} CPUs rounded up" if self.quota % self.period else ""
        return f"cgroup {Path(self.file).name} {self.quota}/{self.period} in {Path(self.file).parent}{fraction}"


def usable_cpus(root: Path = Path("/")) -> CpuCount:
    """The CPUs this process may use: its cgroup's limit, unless it may run on fewer CPUs than that."""
    online = online_cpus()
    limit = cgroup_limit(root)
    if limit is None:
        return online
    if online.cpus < limit.cpus:
        return CpuCount(online.cpus, f"{online.source}, fewer than the {limit}")
    return CpuCount(limit.cpus, str(limit))


def online_cpus() -> CpuCount:
    """The CPUs this process may run on: its affinity, else ``os.cpu_count()``, else 1."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError) as exc:  # AttributeError: not on Linux
        log.debug("no CPU affinity (%s): counting the host's CPUs", exc)
    else:
        if allowed:
            return CpuCount(allowed, f"CPU affinity: {allowed} CPUs")
    count = os.cpu_count()
    return CpuCount(count or 1, f"os.cpu_count(): {count}")


def cgroup_limit(root: Path = Path("/")) -> CpuLimit | None:
    """The smallest CPU limit on the path of this process's cgroup (v2, else v1); ``None`` if none is found."""
    for name, read in (("v2", _v2_limit), ("v1", _v1_limit)):
        try:
            directories = _cgroup_directories(root, name)
            if directories is None:
                continue
            limits = [limit for directory in directories if (limit := read(root, directory)) is not None]
        except (_Unusable, OSError, UnicodeDecodeError) as exc:
            log.debug("cgroup %s CPU limit unusable, trying the next source: %s", name, exc)
            continue
        if limits:
            return min(limits, key=lambda limit: limit.quota / limit.period)  # the deepest of equal ones
        if name == "v2":  # a v2 cgroup with no limit: a v1 hierarchy beside it (hybrid) may have one
            log.debug("no cgroup v2 CPU limit above %s", directories[0])
    return None


def _v2_limit(root: Path, directory: str) -> CpuLimit | None:
    """``cpu.max`` of ``directory``: ``None`` when it has none, or ``max``."""
    text = _read(root, f"{directory}/{_V2_FILE}")
    if text is None:
        return None
    fields = text.split()
    if len(fields) != 2:
        raise _Unusable(f"{directory}/{_V2_FILE}: {text.strip()!r} is not 'QUOTA PERIOD'")
    period = _positive(fields[1], f"{directory}/{_V2_FILE}")
    return None if fields[0] == "max" else CpuLimit(_positive(fields[0], f"{directory}/{_V2_FILE}"), period,
                                                  f"{directory}/{_V2_FILE}")


def _v1_limit(root: Path, directory: str) -> CpuLimit | None:
    """``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` of ``directory``: ``None`` when it has none, or ``-1``."""
    quota = _read(root, f"{directory}/{_V1_QUOTA}")
    if quota is None or quota.strip() == "-1":
        return None
    period = _read(root, f"{directory}/{_V1_PERIOD}")
    if period is None:
        raise _Unusable(f"{directory}: {_V1_QUOTA} without {_V1_PERIOD}")
    return CpuLimit(_positive(quota, f"{directory}/{_V1_QUOTA}"), _positive(period, f"{directory}/{_V1_PERIOD}"),
                    f"{directory}/{_V1_QUOTA}")


def _cgroup_directories(root: Path, version: str) -> list[str] | None:
    """The directories of this process's cgroup and of each above it, up to the mount; ``None`` without one."""
    path = _own_cgroup(root, version)
    mount = _mount(root, version) if path is not None else None
    if path is None or mount is None:
        return None
    point, mount_root = mount
    if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        path = path[len(mount_root.rstrip("/")):]
    else:  # a cgroup the mount does not show (another namespace's): the mount's own cgroup is the nearest
        log.debug("cgroup %s is not under the mount's root %s: reading %s", path, mount_root, point)
        path = ""
    own = f"{point.rstrip('/')}/{path.strip('/')}".rstrip("/") or "/"
    if not (root / own.lstrip("/")).is_dir():
        raise _Unusable(f"{own}, the cgroup of this process, is not a directory")
    return list(_up_to(own, point))


def _up_to(directory: str, top: str) -> Iterator[str]:
    """``directory`` and each directory above it, up to ``top``."""
    while True:
        yield directory
        if directory.rstrip("/") == top.rstrip("/") or directory in ("", "/"):
            return
        directory = directory.rpartition("/")[0] or "/"


def _own_cgroup(root: Path, version: str) -> str | None:
    """This process's cgroup in ``/proc/self/cgroup``: the ``0::`` line (v2) or that of the ``cpu`` controller."""
    text = _read(root, "/proc/self/cgroup")
    for line in (text or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        wanted = number == "0" and not controllers if version == "v2" else "cpu" in controllers.split(",")
        if wanted and path.startswith("/"):
            return path
    return None


def _mount(root: Path, version: str) -> tuple[str, str] | None:
    """Where the ``cgroup2`` hierarchy (v2) or the ``cpu`` controller's (v1) is mounted, and the cgroup it shows
    there (its root), from ``/proc/self/mountinfo``."""
    for line in (_read(root, "/proc/self/mountinfo") or "").splitlines():
        fields, _, tail = line.partition(" - ")
        before, after = fields.split(), tail.split()
        if len(before) < 5 or len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        if (fstype == "cgroup2") if version == "v2" else (fstype == "cgroup" and "cpu" in options):
            return _unescape(before[4]), _unescape(before[3])
    return None


def _read(root: Path, path: str) -> str | None:
    """The text of ``path`` under ``root``; ``None`` if it does not exist (``OSError`` if it cannot be read)."""
    try:
        return (root / path.lstrip("/")).read_text()
    except FileNotFoundError:
        return None


def _positive(text: str, where: str) -> int:
    """``text`` as a whole number above 0."""
    try:
        number = int(text.strip())
    except ValueError:
        raise _Unusable(f"{where}: {text.strip()!r} is not a whole number") from None
    if number <= 0:
        raise _Unusable(f"{where}: {number} is not above 0")
    return number


def _unescape(field: str) -> str:
    """A path of ``/proc/self/mountinfo``, where a space is ``\\040``."""
    return re.sub(r"\\([0-7]{3})", lambda found: chr(int(found[1], 8)), field)
