"""``server.workers: auto``: a real ``toolbooth serve`` whose cgroup allows 2 CPUs (a fake tree) on a host of 64 runs
2 workers, and logs where that number came from.

The process is started by a short script that points ``sidecar.config.cpus`` at the fake tree before ``main`` runs:
the sidecar itself has no setting for it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cgroups import V2_MOUNT, fake_root
from tests.support.cli import REPO, cli_env, stopped
from tests.support.waiting import until_blocking

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two worker processes, ~10 s

_SERVE_IN_A_FAKE_CGROUP = """
import os, sys
from pathlib import Path
from sidecar.cli import main
from sidecar.config import cpus

read = cpus.usable_cpus
cpus.usable_cpus = lambda: read(Path(sys.argv[1]))
os.sched_getaffinity = lambda pid: set(range(64))  # the node's 64 cores
sys.exit(main(sys.argv[2:]))
"""
_SERVING = re.compile(r"toolbooth serving with (\d+) workers \(pids ([\d, ]+)\) on 127\.0\.0\.1:\d+")


def test_auto_runs_as_many_workers_as_the_cgroup_allows_cpus(tmp_path: Path) -> None:
    root = fake_root(tmp_path / "host", v2="/kubepods/pod1/c1",
                     files={f"{V2_MOUNT}/kubepods/pod1/cpu.max": "200000 100000\n",
                            f"{V2_MOUNT}/kubepods/pod1/c1/cpu.max": "max 100000\n"})
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "server": {"listen": ["127.0.0.1:0"], "workers": "auto", "shutdown_grace_seconds": 5},
        "auth": {"mode": "dev"}, "plugins": {"allow": []}, "policy": {"reload_interval_seconds": 0},
        "store": {"sqlite_path": str(tmp_path / "state" / "toolbooth.db")},
    }))
    log = tmp_path / "serve.log"
    with log.open("wb") as err:
        process = subprocess.Popen([sys.executable, "-c", _SERVE_IN_A_FAKE_CGROUP, str(root), "serve", "--config",
                                    str(config)], cwd=REPO, env=cli_env(tmp_path), stdin=subprocess.DEVNULL,
                                   stdout=err, stderr=err)

    def serving() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"toolbooth serve exited with {process.returncode}:\n{log.read_text()}")
        return _SERVING.search(log.read_text()) is not None

    try:
        until_blocking(serving, timeout=60, what="the workers serving")
        output = log.read_text()
        found = _SERVING.search(output)
        assert found is not None and found[1] == "2" and len(set(found[2].split(", "))) == 2, output
        assert (f"server.workers: auto: 2 workers, for cgroup cpu.max 200000/100000 in {V2_MOUNT}/kubepods/pod1"
                in output), output
    finally:
        code = stopped(process)
    assert code == 0, log.read_text()
