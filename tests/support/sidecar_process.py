"""A real sidecar in a process of its own, whose write tools leave a trace every process can see.

The child runs ``main([CONFIG])``: the settings of the YAML/JSON file ``CONFIG`` (plus the usual
``TOOLBOOTH_*`` overrides) and a registry of ``TOOLS``. Each real execution of a tool appends one line,
``PID TEXT``, to the file ``$TOOLBOOTH_TEST_APPEND_LOG`` (``O_APPEND``: lines from several processes
never mix), then sleeps 100 ms so that duplicate executions would overlap (``append_then_wait``: 900 ms
of its 1 s timeout, for a test to kill the process mid-handler). ``$TOOLBOOTH_TEST_DEADLINE_GRACE`` (seconds)
replaces ``DEADLINE_GRACE_SECONDS`` in the child, so that a test need not wait 5 s for a call to be unknown.
The sync tools of ``tests.support.isolated`` are served too, for ``isolation`` in ``CONFIG``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

from sidecar.plugin import SideEffect, ToolContext, tool
from tests.support import isolated
from tests.support.tools import Text

APPEND_LOG_ENV = "TOOLBOOTH_TEST_APPEND_LOG"  # TOOLBOOTH_TEST_*: never read as a setting
DEADLINE_GRACE_ENV = "TOOLBOOTH_TEST_DEADLINE_GRACE"
REPO = Path(__file__).resolve().parents[2]
LAUNCHER = "import sys; from tests.support.sidecar_process import main; main(sys.argv[1:])"


class Appended(BaseModel):
    pid: int
    text: str


async def _append(args: Text, wait: float = 0.1) -> Appended:
    fd = os.open(os.environ[APPEND_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {args.text}\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(wait)
    return Appended(pid=os.getpid(), text=args.text)


@tool(name="append_line", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5)
async def append_line(args: Text, ctx: ToolContext) -> Appended:
    """Append a line to the shared log: one line per real execution."""
    return await _append(args)


@tool(name="append_line_approved", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5)
async def append_line_approved(args: Text, ctx: ToolContext) -> Appended:
    """As ``append_line``; the tests' policies make it need an approval."""
    return await _append(args)


@tool(name="append_then_wait", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=1)
async def append_then_wait(args: Text, ctx: ToolContext) -> Appended:
    """Append a line, then wait 0.9 s: a process killed meanwhile has had the effect, not recorded it."""
    return await _append(args, wait=0.9)


TOOLS = [append_line, append_line_approved, append_then_wait, *isolated.SYNC]


def main(argv: Sequence[str]) -> None:
    """The child process: serve the settings of file ``argv[0]`` with ``TOOLS`` until SIGTERM."""
    from sidecar.bootstrap import serve
    from sidecar.cli.common import setup_logging
    from sidecar.config import load_settings
    from sidecar.state import records
    from sidecar.tools.registry import Registry

    if DEADLINE_GRACE_ENV in os.environ:
        records.DEADLINE_GRACE_SECONDS = float(os.environ[DEADLINE_GRACE_ENV])
    settings = load_settings(Path(argv[0]))
    setup_logging(settings.log_level, settings.logging.format)
    asyncio.run(serve(settings, registry=Registry.from_tools(TOOLS)))


def appended(log: Path) -> list[str]:
    """The lines the tools appended to ``log`` so far."""
    return log.read_text().splitlines() if log.exists() else []


class SidecarProcess:
    """``python -c LAUNCHER CONFIG``, listening on the Unix socket ``socket``; stderr goes to ``stderr``, and so
    does stdout unless it has a file of its own (``stdout``). ``env`` adds variables (``OTEL_*``) to the child's."""

    def __init__(self, config: Path, socket: Path, stderr: Path, append_log: Path, *,
                 deadline_grace: float | None = None, stdout: Path | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.socket, self.stderr = socket, stderr
        child_env = {name: value for name, value in os.environ.items() if not name.startswith(("TOOLBOOTH_", "OTEL_"))}
        child_env.update(PYTHONPATH=str(REPO), **{APPEND_LOG_ENV: str(append_log)}, **(env or {}))
        if deadline_grace is not None:
            child_env[DEADLINE_GRACE_ENV] = str(deadline_grace)
        with stderr.open("wb") as err, (stdout.open("wb") if stdout else contextlib.nullcontext(err)) as out:
            self.process = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(config)], cwd=REPO, env=child_env,
                                            stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=err if stdout else subprocess.STDOUT)

    @property
    def target(self) -> str:
        return f"unix://{self.socket}"

    def output(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    async def wait_serving(self, timeout: float = 20.0) -> None:
        """Return once gRPC health says SERVING; ``AssertionError`` with the output if it exits or never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"sidecar exited with {self.process.returncode}:\n{self.output()}")
            if self.socket.exists() and await self._serving():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"sidecar not SERVING within {timeout}s:\n{self.output()}")

    async def _serving(self) -> bool:
        async with grpc.aio.insecure_channel(self.target) as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout=timeout)
