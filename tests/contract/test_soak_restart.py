"""The soak's real database restart never leaves the server stopped (the soak itself: benchmarks/soak.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.postgres import ADMIN_DSN, PostgresServer

REPO = Path(__file__).resolve().parents[2]


def test_the_soak_starts_the_database_server_again_when_stopping_it_failed(postgres: PostgresServer,
                                                                           tmp_path: Path) -> None:
    """With --stop-command the soak restarts the real server halfway; whatever goes wrong, it runs the start
    command before it exits (here the stop command fails without stopping anything)."""
    stopped, started = tmp_path / "stopped", tmp_path / "started"
    command = ["benchmarks/soak.py", "--postgres", "--minutes", "0.05", "--bucket-seconds", "3", "--peak-seconds",
               "0.5", "--outage-seconds", "0.1", "--stop-command", f"touch {stopped}; exit 3",
               "--start-command", f"touch {started}"]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, env={**os.environ, "TOOLBOOTH_TEST_POSTGRES_DSN": ADMIN_DSN})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "exited with 3" in done.stderr and stopped.exists() and started.exists()
