"""``server.workers: 2``: a real ``toolbooth serve`` supervising two worker processes on one loopback TCP port.

The workers load the test tools of ``tests.support.sidecar_process`` through an installed entry point (each
real execution appends ``PID TEXT`` to a shared file and returns its pid): calls on fresh connections land
on both workers (gRPC and HTTP/JSON), keyed writes through both run once, SIGTERM drains both, a killed worker
is restarted, a worker that cannot start fails the command with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.config import bundled_policy_dir
from sidecar.contract import ErrorCode, Status, ToolResult
from tests.support.cli import stopped
from tests.support.installed import install
from tests.support.sidecar_process import APPEND_LOG_ENV, REPO, appended
from tests.support.waiting import until, until_blocking

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two worker processes a test, ~10 s each

_SERVING = re.compile(r"toolbooth serving with 2 workers \(pids (\d+), (\d+)\) on 127\.0\.0\.1:(\d+)")
_WORKER_SERVING = re.compile(r"worker (\d) serving: pid (\d+)")
_PLUGIN = """
    from sidecar.plugin import Plugin, SideEffect, ToolContext, tool
    from tests.support.sidecar_process import Appended, _append, append_line
    from tests.support.tools import Text

    @tool(name="append_then_hold", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=20)
    async def append_then_hold(args: Text, ctx: ToolContext) -> Appended:
        return await _append(args, wait=1.5)

    PLUGIN = Plugin([append_line, append_then_hold])
"""


class Workers:
    """``toolbooth serve`` with ``server.workers: 2`` as a child process; its stderr in ``log``."""

    def __init__(self, tmp: Path, settings: dict[str, Any]) -> None:
        self.tmp, self.log, self.executions = tmp, tmp / "serve.log", tmp / "executions.log"
        site = tmp / "site"
        if not site.exists():
            install(site, "toolbooth-test-append", "toolbooth_test_append", {"append": "toolbooth_test_append:PLUGIN"},
                    _PLUGIN)
        self.config = tmp / "config.json"
        self.config.write_text(json.dumps(settings))
        env = {name: value for name, value in os.environ.items() if not name.startswith(("TOOLBOOTH_", "OTEL_"))}
        env.update(PYTHONPATH=f"{site}{os.pathsep}{REPO}", **{APPEND_LOG_ENV: str(self.executions)})
        self.env = env
        with self.log.open("wb") as err:
            self.process = subprocess.Popen([sys.executable, "-m", "sidecar", "serve", "--config", str(self.config)],
                                            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        self.pids: tuple[int, int] = (0, 0)
        self.target = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_serving(self) -> None:
        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"toolbooth serve exited with {self.process.returncode}:\n{self.output()}")
            return _SERVING.search(self.output()) is not None

        until_blocking(serving, timeout=60, what="both workers serving")
        found = _SERVING.search(self.output())
        assert found is not None
        self.pids = (int(found[1]), int(found[2]))
        self.target = f"127.0.0.1:{found[3]}"

    def worker_pids(self) -> dict[int, int]:
        """Each worker's newest pid, as the supervisor logged them."""
        return {int(index): int(pid) for index, pid in _WORKER_SERVING.findall(self.output())}

    def stop(self) -> int:
        return stopped(self.process)

    @classmethod
    @contextlib.contextmanager
    def serving(cls, tmp: Path, settings: dict[str, Any]) -> Iterator[Workers]:
        """Started and serving for the block; stopped after it, its output printed."""
        running = cls(tmp, settings)
        try:
            running.wait_serving()
            yield running
        finally:
            code = running.stop()
            print(f"--- toolbooth serve exited with {code}:\n{running.output()}")


def settings(tmp: Path, **server: Any) -> dict[str, Any]:
    return {
        "server": {"listen": ["127.0.0.1:0"], "workers": 2, "shutdown_grace_seconds": 5, **server},
        "auth": {"mode": "dev"},
        "plugins": {"allow": ["append"]},
        "policy": {"reload_interval_seconds": 0},
        "store": {"sqlite_path": str(tmp / "state" / "toolbooth.db")},
    }


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with Workers.serving(tmp_path, {**settings(tmp_path, health_listen="127.0.0.1:0"),
                                    "http_json": {"listen": "127.0.0.1:0"}}) as running:
        yield running


async def call(target: str, text: str, key: str, tool: str = "append_line") -> ToolResult:
    """One call on a connection of its own (no subchannel shared with other channels of this process): the
    kernel picks the worker that accepts it."""
    async with grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        request = pb.ExecuteToolRequest(tool=tool, arguments_json=json.dumps({"text": text}), idempotency_key=key)
        return convert.result_from_pb(await pb_grpc.ToolServiceStub(channel).ExecuteTool(request, timeout=20))


def pid_of(result: ToolResult) -> int:
    assert result.status is Status.SUCCESS and result.data is not None, result
    return int(result.data["pid"])


def outcome(result: ToolResult) -> str:
    if result.status is Status.SUCCESS:
        return "replayed" if result.meta.idempotency_replayed else "fresh"
    return result.error.code if result.error is not None else str(result.status)


async def test_calls_on_new_connections_spread_over_both_workers(workers: Workers) -> None:
    assert len(set(workers.pids)) == 2
    results = await asyncio.gather(*(call(workers.target, f"spread {n}", f"k-{n}") for n in range(24)))
    served = Counter(pid_of(result) for result in results)
    assert set(served) == set(workers.pids), (served, workers.pids)  # all on one worker: 2**-23
    assert len(appended(workers.executions)) == 24


async def test_http_json_is_served_by_every_worker_on_one_port(workers: Workers) -> None:
    urls = dict(re.findall(r"\[worker (\d)\]: HTTP/JSON calls on (http://127\.0\.0\.1:\d+/v1/call)", workers.output()))
    assert set(urls) == {"0", "1"} and urls["0"] == urls["1"], urls

    async def one_call(n: int) -> ToolResult:  # a connection of its own: the kernel picks the worker
        async with httpx2.AsyncClient(timeout=20) as http:
            answer = await http.post(urls["0"], json={"tool": "append_line", "arguments": {"text": f"json {n}"},
                                                      "idempotency_key": f"j-{n}"})
        return ToolResult.model_validate(answer.json())

    served = Counter(pid_of(result) for result in await asyncio.gather(*(one_call(n) for n in range(24))))
    assert set(served) == set(workers.pids), (served, workers.pids)  # all on one worker: 2**-23


async def test_a_keyed_write_sent_through_both_workers_runs_once(workers: Workers) -> None:
    results = await asyncio.gather(*(call(workers.target, "once", "k-once") for _ in range(24)))
    outcomes = Counter(outcome(result) for result in results)
    assert outcomes["fresh"] == 1, outcomes
    assert set(outcomes) <= {"fresh", "replayed", ErrorCode.OPERATION_IN_PROGRESS}, outcomes
    assert len(appended(workers.executions)) == 1
    # The first call has finished: retries on new connections (either worker) replay its result.
    retries = await asyncio.gather(*(call(workers.target, "once", "k-once") for _ in range(8)))
    assert {outcome(retry) for retry in retries} == {"replayed"}
    assert len(appended(workers.executions)) == 1
    assert workers.stop() == 0
    verify = subprocess.run([sys.executable, "-m", "sidecar", "audit", "verify", "--config", str(workers.config)],
                            cwd=REPO, env=workers.env, capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_sigterm_drains_the_calls_in_flight_on_both_workers(workers: Workers) -> None:
    # append_then_hold takes 1.5 s after it appended: SIGTERM arrives while every one of them runs.
    calls = [asyncio.create_task(call(workers.target, f"drain {n}", f"d-{n}", "append_then_hold")) for n in range(12)]
    await until(lambda: len(appended(workers.executions)) == 12, timeout=20, what="12 calls running")
    workers.process.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*calls)
    assert {pid_of(result) for result in results} == set(workers.pids)
    assert await asyncio.to_thread(workers.process.wait, 60) == 0
    for pid in workers.pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), f"worker {pid} outlived the supervisor"


async def test_a_killed_worker_is_restarted_and_the_other_serves_meanwhile(workers: Workers) -> None:
    killed = workers.pids[1]
    os.kill(killed, signal.SIGKILL)
    until_blocking(lambda: workers.worker_pids()[1] != killed, timeout=60, what="worker 1 restarted")
    assert f"worker 1 (pid {killed}) was killed by SIGKILL; restarting it" in workers.output()
    restarted = workers.worker_pids()[1]
    results = await asyncio.gather(*(call(workers.target, f"after {n}", f"a-{n}") for n in range(24)))
    assert {pid_of(result) for result in results} == {workers.pids[0], restarted}
    assert workers.process.poll() is None


async def test_the_probe_port_is_served_by_every_worker(workers: Workers) -> None:
    address = re.search(r"\[worker (\d)\]: health only \(for probes\) on (127\.0\.0\.1:\d+)", workers.output())
    assert address is not None
    assert f"[worker {1 - int(address[1])}]: health only (for probes) on {address[2]}" in workers.output()
    for _ in range(4):  # a connection each: either worker answers
        async with grpc.aio.insecure_channel(address[2], options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_worker_that_cannot_start_fails_the_command_with_its_error(tmp_path: Path) -> None:
    # Worker i serves metrics on metrics.listen's port + i: make worker 1's port taken.
    with _listening() as taken:
        port = taken.getsockname()[1]
        failing = Workers(tmp_path, {**settings(tmp_path), "metrics": {"listen": f"127.0.0.1:{port - 1}"}})
        code = failing.process.wait(timeout=60)
    assert code == 1, failing.output()
    assert f"worker 1: cannot listen on metrics.listen 127.0.0.1:{port}" in failing.output()
    assert "the port is in use" in failing.output()


def test_unix_sockets_with_workers_are_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"server": {"listen": [f"unix://{tmp_path}/tb.sock"], "workers": 2}}))
    done = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "config error at server: workers: 2 needs TCP addresses only" in done.stderr


@contextlib.contextmanager
def _listening(port: int = 0) -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock


def _free_pair() -> int:
    """A port that is free together with the one above it (worker i listens for metrics on port + i)."""
    for _ in range(100):
        with _listening() as probe:
            port = probe.getsockname()[1]
            with contextlib.suppress(OSError), _listening(port + 1):
                return port
    raise AssertionError("no two adjacent free ports in 100 tries")


def _is_zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    return True


def test_workers_die_with_the_supervisor(workers: Workers) -> None:
    workers.process.kill()  # SIGKILL: nothing forwarded; the kernel tells the workers (PR_SET_PDEATHSIG)
    workers.process.wait(timeout=10)
    until_blocking(lambda: all(_is_zombie(pid) for pid in workers.pids), timeout=60, what="both workers gone")


async def test_each_worker_reloads_a_changed_policy(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(bundled_policy_dir(), policies)
    config = settings(tmp_path)
    config["policy"] = {"path": str(policies), "reload_interval_seconds": 0.2}
    running = Workers(tmp_path, config)
    try:
        running.wait_serving()
        before = await call(running.target, "before", "r-0")
        data = json.loads((policies / "data.json").read_text())
        data["toolbooth"]["reloaded"] = True
        (policies / "data.json").write_text(json.dumps(data))
        seen: dict[int, str] = {}

        async def both_reloaded() -> bool:
            results = await asyncio.gather(*(call(running.target, "after", f"r-{uuid.uuid4()}") for _ in range(8)))
            seen.update({pid_of(result): result.meta.policy_revision for result in results})
            return len(seen) == 2 and before.meta.policy_revision not in seen.values()

        await until(both_reloaded, timeout=60, what="both workers on the new revision")
        assert set(seen) == set(running.pids) and len(set(seen.values())) == 1
    finally:
        running.stop()
        print(running.output())


def test_a_worker_that_keeps_dying_stops_the_sidecar_instead_of_restarting_forever(tmp_path: Path) -> None:
    port = _free_pair()  # worker 0's metrics port and, one above it, worker 1's
    running = Workers(tmp_path, {**settings(tmp_path), "metrics": {"listen": f"127.0.0.1:{port}"}})
    try:
        running.wait_serving()
        os.kill(running.pids[1], signal.SIGKILL)
        until_blocking(lambda: "worker 1 (pid" in running.output(), timeout=30, what="the death logged")
        with _listening(port + 1):  # every restart of worker 1 now fails: its metrics port is taken
            code = running.process.wait(timeout=120)
    finally:
        running.stop()
    output = running.output()
    assert code == 1, output
    assert "restarting worker 1 failed: worker 1: cannot listen on metrics.listen" in output
    assert "workers died 6 times within 60 s: stopping instead of restarting them again" in output
    assert _is_zombie(running.pids[0]), "worker 0 outlived the supervisor"
