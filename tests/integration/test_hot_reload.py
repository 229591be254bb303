"""``serve`` watches its policy directory: changes load, broken ones are refused, tests can gate them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar import cli
from sidecar.client import AsyncClient
from sidecar.config import Settings, bundled_policy_dir
from sidecar.policy.reload import ReloadStatus
from sidecar.registry import Registry
from sidecar.server import serve
from tests.support import tools

pytestmark = pytest.mark.integration
DENY_ECHO = (bundled_policy_dir() / "authz.rego").read_text().replace(
    "default decision :=", 'decision := {"allow": false, "reason": "echo is closed"} if input.tool.name == "echo"\n'
                           "\nelse := x if {\n\tx := fallback\n}\n\nfallback :=", 1)


def touch(path: Path, text: str) -> None:
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))


@pytest.fixture
async def serving(make_settings: Callable[..., Settings], socket_path: Path,
                  policies: Path) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def start(**policy: Any) -> str:
        settings = make_settings(server={"listen": [f"unix://{socket_path}"]},
                                 policy={"path": str(policies), "reload_interval_seconds": 0.05, **policy})
        tasks.append(asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop)))
        for _ in range(200):
            if socket_path.exists():
                return f"unix://{socket_path}"
            await asyncio.sleep(0.02)
        raise AssertionError("the sidecar did not start")

    yield start
    stop.set()
    await asyncio.gather(*tasks)


async def until(client: AsyncClient, ready: Callable[[ReloadStatus], bool]) -> ReloadStatus:
    for _ in range(200):
        status = await client.policy_status()
        if ready(status):
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"policy status never became ready: {status}")


async def test_changes_load_and_broken_changes_are_refused(serving: Any, policies: Path) -> None:
    async with AsyncClient(await serving(), timeout=5) as client:
        first = await client.policy_status()
        assert (await client.execute("echo", {"text": "x"})).data is not None

        touch(policies / "availability.rego", "package toolbooth.availability\n\ndecision := {")
        refused = await until(client, lambda status: not status.healthy)
        assert refused.revision == first.revision and "availability.rego" in (refused.last_error or "")
        assert (await client.execute("echo", {"text": "x"})).meta.policy_revision == first.revision

        touch(policies / "availability.rego", (bundled_policy_dir() / "availability.rego").read_text())
        touch(policies / "data.json", (policies / "data.json").read_text().replace(
            '"admin_console": {', '"echo": {"roles": ["admin"]},\n      "admin_console": {'))
        loaded = await until(client, lambda status: status.healthy and status.revision != first.revision)
        hidden = await client.execute("echo", {"text": "x"})
        assert hidden.error is not None and hidden.error.code.value == "TOOL_UNAVAILABLE"
        assert hidden.meta.policy_revision == loaded.revision


async def test_failing_policy_tests_refuse_a_change(serving: Any, policies: Path) -> None:
    async with AsyncClient(await serving(reload_requires_tests=True), timeout=5) as client:
        first = await client.policy_status()
        touch(policies / "gate_test.rego", "package toolbooth.gate_test\n\nimport rego.v1\n\n"
                                            "test_always_fails if false\n")
        refused = await until(client, lambda status: not status.healthy)
        assert refused.revision == first.revision
        assert "policy tests" in (refused.last_error or "") and "test_always_fails" in (refused.last_error or "")


async def test_policy_status_command(serving: Any, policies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = await serving()
    assert await asyncio.to_thread(cli.main, ["policy", "status", "--target", target]) == 0
    healthy = capsys.readouterr().out
    assert healthy.startswith("revision    sha256:") and f"source      directory {policies}" in healthy

    touch(policies / "authz.rego", "package toolbooth.authz\n\ndecision := {")
    async with AsyncClient(target, timeout=5) as client:
        await until(client, lambda status: not status.healthy)
    assert await asyncio.to_thread(cli.main, ["policy", "status", "--target", target, "--output", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["revision"] in healthy and "authz.rego" in document["last_error"]
