"""``toolbooth`` as a real process: ``serve`` on a real Unix socket in a short temporary directory, and the
commands run against it (``toolbooth``), each with a clean environment (``cli_env``)."""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
import signal
import struct
import subprocess
import sys
import tempfile
import termios
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.installed import BUNDLED_PLUGINS
from tests.support.waiting import until_blocking

REPO = Path(__file__).resolve().parents[2]
ADD_2_3 = '{"operation": "add", "operands": [2, 3]}'
START_TIMEOUT = 30.0
ALLOW_BUNDLED = f"  allow: [{', '.join(BUNDLED_PLUGINS)}]\n"  # the body of a config's ``plugins`` section


@dataclass
class Sidecar:
    """A ``toolbooth serve`` process and where it listens."""

    process: subprocess.Popen[bytes]
    socket: Path
    log: Path

    @property
    def target(self) -> str:
        return f"unix://{self.socket}"

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=20)


def stopped(process: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """``process`` sent SIGTERM (if still running) and waited for, killed if it has not exited within ``timeout``;
    its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=10)


def short_dir() -> Path:
    """A temporary directory with a short path: Unix socket paths are limited to ~107 bytes."""
    return Path(tempfile.mkdtemp(prefix="tb-cli-", dir="/tmp"))


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without TOOLBOOTH_* settings, with default paths inside ``home``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
    env.update(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(home / "run"), XDG_STATE_HOME=str(home / "state"), **extra)
    return env


def toolbooth(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sidecar ARGS`` to completion."""
    return subprocess.run([sys.executable, "-m", "sidecar", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def write_config(home: Path, *, policy: Path | None = None, plugins: str = ALLOW_BUNDLED) -> Path:
    """``home/toolbooth.yaml``: listening on ``home/tb.sock``, the store in ``home``; ``plugins``: the body of the
    ``plugins`` section (indented; by default the bundled plugins are allowed, and only them)."""
    lines = [f"server:\n  listen: ['unix://{home}/tb.sock']", f"store:\n  sqlite_path: {home}/tb.db"]
    if policy is not None:
        lines.append(f"policy:\n  path: {policy}")
    lines.append(f"plugins:\n{plugins}".rstrip("\n"))
    path = home / "toolbooth.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_sidecar(home: Path, socket: Path, *args: str, env: dict[str, str] | None = None) -> Sidecar:
    """Start ``toolbooth serve ARGS`` (with ``env``, default ``cli_env(home)``) and wait until its health check
    says SERVING."""
    log = home / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "sidecar", "serve", *args], cwd=REPO,
                                   env=cli_env(home) if env is None else env, stdout=out, stderr=subprocess.STDOUT)
    sidecar = Sidecar(process, socket, log)
    try:
        _wait_serving(sidecar)
    except BaseException:
        sidecar.stop(signal.SIGKILL)
        raise
    return sidecar


def _wait_serving(sidecar: Sidecar) -> None:
    def serving() -> bool:
        if sidecar.process.poll() is not None:
            pytest.fail(f"serve exited with {sidecar.process.returncode}:\n{sidecar.log.read_text()}")
        return sidecar.socket.exists() and _serving(sidecar.target)

    try:
        until_blocking(serving, timeout=START_TIMEOUT, what="serve's health SERVING")
    except AssertionError as exc:
        pytest.fail(f"{exc}:\n{sidecar.log.read_text()}")


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass
class TtyRun:
    """A command run with its stderr on a terminal (a pty): its exit code, stdout, and what the terminal got."""

    returncode: int
    stdout: str
    terminal: str


def run_tty_stderr(argv: list[str], *, env: dict[str, str]) -> TtyRun:
    """Run ``argv`` with stdout a pipe and stderr a pseudo-terminal of 100x30 cells, to completion."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    try:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=terminal,
                                   stdin=subprocess.DEVNULL)
    finally:
        os.close(terminal)
    assert process.stdout is not None
    with concurrent.futures.ThreadPoolExecutor(1) as reader:  # stdout is read meanwhile: a full pipe would block
        stdout = reader.submit(process.stdout.read)
        received = bytearray()
        while True:  # until the child's end of the terminal is closed: EIO (Linux) or an empty read
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        os.close(controller)
        out = stdout.result(timeout=60).decode()
    process.stdout.close()
    return TtyRun(process.wait(timeout=60), out, received.decode(errors="replace"))
