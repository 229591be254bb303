"""Ctrl-C (SIGINT) ends a real ``toolbooth`` process with exit 130 and one line on stderr, wherever it comes: while
the command's modules load, while ``serve`` starts, while ``policy test`` runs, while ``call`` waits for a reply.

Each process is interrupted at an event it shows: a module it imported (``python -X importtime`` writes a line
to stderr as each import ends), or a connection it opened to a listener of the test's that never answers.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import REPO, START_TIMEOUT, cli_env

pytestmark = pytest.mark.integration

_INTERRUPTED = ["toolbooth: interrupted"]
_SLOW_POLICY = """package slow

import rego.v1

total := count([x | some x in numbers.range(1, 2000000)])
"""
_SLOW_TESTS = """package slow_test

import rego.v1

test_a_long_count if data.slow.total == 2000000

test_another_long_count if data.slow.total > 1
"""


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """A TCP listener that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(START_TIMEOUT)
        yield listener


def _toolbooth(home: Path, *args: str, imports: bool = False) -> subprocess.Popen[str]:
    """``python -m sidecar ARGS`` started (with ``imports``, writing a line to stderr as each import ends)."""
    flags = ["-X", "importtime"] if imports else []
    return subprocess.Popen([sys.executable, *flags, "-m", "sidecar", *args], cwd=REPO, env=cli_env(home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt_after_import(process: subprocess.Popen[str], module: str) -> list[str]:
    """SIGINT ``process`` as soon as its import of ``module`` ends; the lines of stderr until then."""
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("import time:") and line.split("|")[-1].strip() == module:
            process.send_signal(signal.SIGINT)
            return seen
    pytest.fail(f"the process ended ({process.wait()}) without importing {module}:\n{''.join(seen)}")


def _interrupt_on_connection(process: subprocess.Popen[str], listener: socket.socket) -> None:
    """SIGINT ``process`` once it has connected to ``listener``."""
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        process.kill()
        pytest.fail(f"the process never connected:\n{process.communicate()[1]}")
    with contextlib.closing(connection):
        process.send_signal(signal.SIGINT)
        _assert_interrupted(process)


def _assert_interrupted(process: subprocess.Popen[str], before: list[str] | None = None) -> None:
    out, err = process.communicate(timeout=60)
    said = [line for line in [*(before or []), *err.splitlines()] if not line.startswith("import time:")]
    assert (process.returncode, said, out) == (130, _INTERRUPTED, ""), err


@pytest.mark.parametrize("module", ["sidecar.config", "sidecar.cli.serve"])  # serve imports its group alone
def test_ctrl_c_while_serve_loads_its_modules(home: Path, module: str) -> None:
    config = home / "toolbooth.yaml"
    config.write_text(f"server:\n  listen: ['unix://{home}/tb.sock']\nstore:\n  sqlite_path: {home}/tb.db\n")
    process = _toolbooth(home, "serve", "--config", str(config), imports=True)
    _assert_interrupted(process, _interrupt_after_import(process, module))
    assert not (home / "tb.sock").exists()


def test_ctrl_c_while_serve_starts(home: Path, silent: socket.socket) -> None:
    port = silent.getsockname()[1]
    config = home / "toolbooth.yaml"
    config.write_text(f"server:\n  listen: ['unix://{home}/tb.sock']\n"
                      f"store:\n  postgres_dsn: postgresql://toolbooth@127.0.0.1:{port}/toolbooth\n")
    _interrupt_on_connection(_toolbooth(home, "serve", "--config", str(config)), silent)  # opening its store


def test_ctrl_c_while_policy_test_runs(home: Path) -> None:
    policies = home / "policies"
    policies.mkdir()
    (policies / "slow.rego").write_text(_SLOW_POLICY)
    (policies / "slow_test.rego").write_text(_SLOW_TESTS)
    process = _toolbooth(home, "policy", "test", "--policies", str(policies), imports=True)
    _assert_interrupted(process, _interrupt_after_import(process, "sidecar.cli.policy"))  # its group: it runs


def test_ctrl_c_while_a_call_waits_for_its_reply(home: Path, silent: socket.socket) -> None:
    target = f"127.0.0.1:{silent.getsockname()[1]}"
    process = _toolbooth(home, "call", "calculate", "--args", '{"operation": "add", "operands": [2, 3]}',
                         "--target", target, "--timeout", "60")
    _interrupt_on_connection(process, silent)
