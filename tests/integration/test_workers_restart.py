"""``server.workers: 2`` on a fixed loopback port, stopped and started again at once: a real ``toolbooth serve``.

A connection the sidecar closed stays in TIME-WAIT on its port for a minute; the sidecar started again right
away binds the port all the same. A port held by a socket that does not listen (as a connection still closing
holds it) is waited for, said in the log, instead of failing with "the port is in use".
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.server.listeners import listening
from tests.support.cli import REPO, cli_env, stopped
from tests.support.waiting import until_blocking

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(listening(0) is None, reason="the kernel does not list its sockets (not Linux)")]

_SERVING = re.compile(r"toolbooth serving with 2 workers \(pids \d+, \d+\) on 127\.0\.0\.1:(\d+)")
_TIME_WAIT = "06"  # TCP_TIME_WAIT, as /proc/net/tcp writes it


class Serve:
    """``toolbooth serve`` with two workers on ``port`` as a child process; its stderr in ``log``."""

    def __init__(self, home: Path, port: int, run: int) -> None:
        self.log = home / f"serve-{run}.log"
        config = home / "toolbooth.json"
        config.write_text(json.dumps({
            "server": {"listen": [f"127.0.0.1:{port}"], "workers": 2, "shutdown_grace_seconds": 2},
            "policy": {"reload_interval_seconds": 0}, "store": {"sqlite_path": str(home / "toolbooth.db")}}))
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "sidecar", "serve", "--config", str(config)],
                                            cwd=REPO, env=cli_env(home), stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=out)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, shows: re.Pattern[str], what: str) -> None:
        """Until its log ``shows`` a match (``AssertionError`` naming ``what`` if it exits first or it takes
        longer than the wait for a TIME-WAIT)."""
        def shown() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"toolbooth serve exited with {self.process.returncode}:\n{self.output()}")
            return shows.search(self.output()) is not None

        until_blocking(shown, timeout=90, what=what)

    def stop(self) -> int:
        return stopped(self.process)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _healthy(port: int) -> grpc.Channel:
    """A channel of its own to ``port`` whose health check says SERVING (its connection stays open)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return channel


def _watching(port: int) -> tuple[grpc.Channel, Iterator[health_pb2.HealthCheckResponse]]:
    """A channel of its own to ``port`` with a health watch that has said SERVING and stays open."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    return channel, watch


def _time_waits(port: int) -> int:
    """Connections on local ``port`` in TIME-WAIT."""
    rows = [line.split() for table in ("/proc/net/tcp", "/proc/net/tcp6")
            for line in Path(table).read_text().splitlines()[1:]]
    return sum(1 for row in rows if row[3] == _TIME_WAIT and int(row[1].rsplit(":", 1)[1], 16) == port)


def test_a_restart_right_after_a_stop_binds_the_port_its_connections_left_in_time_wait(home: Path,
                                                                                        port: int) -> None:
    first = Serve(home, port, 1)
    try:
        first.wait_for(_SERVING, "both workers serving")
        watches = [_watching(port) for _ in range(4)]  # calls in flight when it stops: the sidecar ends them
    finally:                                            # and closes their connections (left in TIME-WAIT)
        assert first.stop() == 0, first.output()
    for channel, _ in watches:
        channel.close()
    assert _time_waits(port) > 0

    again = Serve(home, port, 2)
    try:
        again.wait_for(_SERVING, "both workers serving again")
        _healthy(port).close()
    finally:
        assert again.stop() == 0, again.output()
    assert "port is in use" not in again.output()


def test_a_port_held_by_a_socket_that_does_not_listen_is_waited_for(home: Path, port: int) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))  # no SO_REUSEADDR, not listening: as a client's connection closing there
    serve = Serve(home, port, 1)
    try:
        serve.wait_for(re.compile(rf"port {port} is held by .* waiting"), "the supervisor waiting for the port")
        assert serve.process.poll() is None
        holder.close()
        serve.wait_for(_SERVING, "both workers serving once the port is free")
        _healthy(port).close()
    finally:
        holder.close()
        assert serve.stop() == 0, serve.output()
