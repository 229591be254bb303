"""``sidecar.config.cpus``: the CPUs ``server.workers: auto`` counts, read from fake cgroup v2 and v1 trees."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from sidecar.config import cpus
from sidecar.config.cpus import CpuCount, cgroup_limit, online_cpus, usable_cpus
from tests.support.cgroups import V1_MOUNT, V2_MOUNT, fake_root

POD = "/kubepods.slice/pod1"
CONTAINER = f"{POD}/cri-c1"


@pytest.fixture(autouse=True)
def eight_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process may run on 8 CPUs, whatever this machine has."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


def v2(tmp_path: Path, **files: str) -> Path:
    """A cgroup v2 host, the process in ``CONTAINER``; ``files``: ``cpu.max`` by level (``pod``, ``container``)."""
    where = {"top": V2_MOUNT, "pod": f"{V2_MOUNT}{POD}", "container": f"{V2_MOUNT}{CONTAINER}"}
    return fake_root(tmp_path, v2=CONTAINER, files={f"{where[level]}/cpu.max": text for level, text in files.items()})


def v1(tmp_path: Path, quota: str, period: str = "100000\n", **more: str) -> Path:
    return fake_root(tmp_path, v1=CONTAINER, files={f"{V1_MOUNT}{CONTAINER}/cpu.cfs_quota_us": quota,
                                                   f"{V1_MOUNT}{CONTAINER}/cpu.cfs_period_us": period, **more})


@pytest.mark.parametrize(("text", "count"), [("200000 100000\n", 2), ("150000 100000\n", 2), ("100000 100000\n", 1),
                                             ("50000 100000\n", 1), ("1000 100000", 1), ("6400000 100000\n", 64)])
def test_cpu_max_is_quota_over_period_rounded_up(tmp_path: Path, text: str, count: int) -> None:
    assert usable_cpus(v2(tmp_path, container=text)).cpus == min(count, 8)
    limit = cgroup_limit(tmp_path)
    assert limit is not None and limit.cpus == count


def test_the_source_says_which_file_and_what_it_holds(tmp_path: Path) -> None:
    assert usable_cpus(v2(tmp_path, container="200000 100000\n")) == CpuCount(
        2, f"cgroup cpu.max 200000/100000 in {V2_MOUNT}{CONTAINER}")
    assert str(cgroup_limit(v2(tmp_path, container="150000 100000\n"))) == (
        f"cgroup cpu.max 150000/100000 in {V2_MOUNT}{CONTAINER}, 1.5 CPUs rounded up")


def test_max_is_no_limit_so_the_affinity_counts(tmp_path: Path) -> None:
    assert usable_cpus(v2(tmp_path, container="max 100000\n", pod="max 100000\n")) == CpuCount(
        8, "CPU affinity: 8 CPUs")


def test_a_smaller_limit_deeper_wins(tmp_path: Path) -> None:
    found = usable_cpus(v2(tmp_path, pod="400000 100000\n", container="100000 100000\n"))
    assert found == CpuCount(1, f"cgroup cpu.max 100000/100000 in {V2_MOUNT}{CONTAINER}")


def test_a_smaller_limit_higher_up_wins(tmp_path: Path) -> None:
    """A pod's limit binds its containers, even one whose own file says max (or a larger limit)."""
    assert usable_cpus(v2(tmp_path, pod="300000 100000\n", container="max 100000\n")) == CpuCount(
        3, f"cgroup cpu.max 300000/100000 in {V2_MOUNT}{POD}")
    assert usable_cpus(v2(tmp_path, top="200000 100000\n", pod="300000 100000\n", container="500000 100000\n")) == \
        CpuCount(2, f"cgroup cpu.max 200000/100000 in {V2_MOUNT}")


def test_a_cgroup_namespace_shows_the_container_at_the_mount(tmp_path: Path) -> None:
    """In a container with its own cgroup namespace, ``0::/`` is its cgroup and the mount is that cgroup."""
    root = fake_root(tmp_path, v2="/", files={f"{V2_MOUNT}/cpu.max": "200000 100000\n"})
    assert usable_cpus(root).cpus == 2


def test_a_mount_showing_a_cgroup_below_the_root_is_read_from_there(tmp_path: Path) -> None:
    """No namespace, but the container's own cgroup mounted (mountinfo's root field is that cgroup)."""
    root = fake_root(tmp_path, v2=CONTAINER, mount_root=CONTAINER, files={f"{V2_MOUNT}/cpu.max": "300000 100000\n"})
    assert usable_cpus(root) == CpuCount(3, f"cgroup cpu.max 300000/100000 in {V2_MOUNT}")


def test_a_mount_point_with_a_space_is_unescaped(tmp_path: Path) -> None:
    root = fake_root(tmp_path, v2="/a", v2_mount="/sys/fs/my cgroup", files={"/sys/fs/my cgroup/a/cpu.max": "2 1"})
    assert usable_cpus(root).cpus == 2


def test_cgroup_v1_quota_over_period(tmp_path: Path) -> None:
    assert usable_cpus(v1(tmp_path, "250000\n")) == CpuCount(
        3, f"cgroup cpu.cfs_quota_us 250000/100000 in {V1_MOUNT}{CONTAINER}, 2.5 CPUs rounded up")


def test_a_v1_quota_of_minus_one_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_limit(v1(tmp_path, "-1\n")) is None
    assert usable_cpus(tmp_path) == CpuCount(8, "CPU affinity: 8 CPUs")


def test_v1_takes_the_smallest_limit_on_the_path_too(tmp_path: Path) -> None:
    root = v1(tmp_path, "-1\n", **{f"{V1_MOUNT}{POD}/cpu.cfs_quota_us": "100000\n",
                                   f"{V1_MOUNT}{POD}/cpu.cfs_period_us": "50000\n"})
    assert usable_cpus(root) == CpuCount(2, f"cgroup cpu.cfs_quota_us 100000/50000 in {V1_MOUNT}{POD}")


def test_v1_is_read_when_v2_has_no_cpu_controller(tmp_path: Path) -> None:
    """A hybrid host: cgroup2 at /sys/fs/cgroup/unified without cpu.max, the cpu controller in v1."""
    root = fake_root(tmp_path, v2=CONTAINER, v1=CONTAINER, v2_mount="/sys/fs/cgroup/unified",
                     files={f"{V1_MOUNT}{CONTAINER}/cpu.cfs_quota_us": "300000\n",
                            f"{V1_MOUNT}{CONTAINER}/cpu.cfs_period_us": "100000\n"})
    assert usable_cpus(root).cpus == 3


@pytest.mark.parametrize("text", ["200000", "200000 100000 7", "two 100000", "200000 0", "0 100000", "-5 100000",
                                  "max max", "", "\x00\x01"])
def test_a_malformed_cpu_max_falls_back_to_v1_then_the_affinity(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger=cpus.__name__)
    assert usable_cpus(v2(tmp_path, container=text, pod="100000 100000\n")) == CpuCount(8, "CPU affinity: 8 CPUs")
    assert "cgroup v2 CPU limit unusable, trying the next source" in caplog.text
    assert f"{V2_MOUNT}{CONTAINER}/cpu.max" in caplog.text
    both = fake_root(tmp_path / "both", v2=CONTAINER, v1=CONTAINER,
                     files={f"{V2_MOUNT}{CONTAINER}/cpu.max": text, f"{V1_MOUNT}{CONTAINER}/cpu.cfs_quota_us": "400000",
                            f"{V1_MOUNT}{CONTAINER}/cpu.cfs_period_us": "100000"})
    assert usable_cpus(both).cpus == 4  # v1 beside the malformed v2 file


@pytest.mark.parametrize(("quota", "period"), [("lots", "100000"), ("200000", "0"), ("200000", ""), ("0", "100000")])
def test_a_malformed_v1_file_falls_back_to_the_affinity(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, quota: str, period: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger=cpus.__name__)
    assert usable_cpus(v1(tmp_path, quota, period)).cpus == 8
    assert "cgroup v1 CPU limit unusable" in caplog.text


def test_a_v1_quota_without_its_period_is_unusable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=cpus.__name__)
    root = fake_root(tmp_path, v1=CONTAINER, files={f"{V1_MOUNT}{CONTAINER}/cpu.cfs_quota_us": "200000"})
    assert usable_cpus(root).cpus == 8
    assert "cpu.cfs_quota_us without cpu.cfs_period_us" in caplog.text


def test_an_unreadable_file_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=cpus.__name__)
    root = v2(tmp_path)
    (root / f"{V2_MOUNT}{CONTAINER}/cpu.max".lstrip("/")).mkdir()  # reading it: IsADirectoryError
    assert usable_cpus(root).cpus == 8
    assert "cgroup v2 CPU limit unusable" in caplog.text


def test_no_proc_files_or_no_mount_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_limit(tmp_path) is None  # nothing at all
    root = v2(tmp_path, container="200000 100000\n")
    (root / "proc/self/mountinfo").write_text("25 1 8:1 / / rw - ext4 /dev/sda1 rw\nnot a mount line\n")
    assert cgroup_limit(root) is None
    (root / "proc/self/mountinfo").unlink()
    assert usable_cpus(root) == CpuCount(8, "CPU affinity: 8 CPUs")


def test_a_cgroup_directory_that_is_missing_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=cpus.__name__)
    root = fake_root(tmp_path / "elsewhere", v2=CONTAINER)
    (root / "proc/self/cgroup").write_text("0::/gone\n")
    assert usable_cpus(root).cpus == 8
    assert f"{V2_MOUNT}/gone, the cgroup of this process, is not a directory" in caplog.text


def test_fewer_cpus_to_run_on_than_the_limit_counts_those(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert usable_cpus(v2(tmp_path, container="400000 100000\n")) == CpuCount(
        2, f"CPU affinity: 2 CPUs, fewer than the cgroup cpu.max 400000/100000 in {V2_MOUNT}{CONTAINER}")


def test_without_affinity_the_host_cpus_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    assert online_cpus() == CpuCount(12, "os.cpu_count(): 12")
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert online_cpus() == CpuCount(1, "os.cpu_count(): None")


def test_this_machine_is_counted_without_raising() -> None:
    assert usable_cpus().cpus >= 1
