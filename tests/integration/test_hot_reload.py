"""``serve`` watches its policy directory: changes load, broken ones are refused, tests can gate them."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.config import bundled_policy_dir
from tests.support.reloading import rewrite, until_status

pytestmark = pytest.mark.integration
DENY_ECHO = (bundled_policy_dir() / "authz.rego").read_text().replace(
    "default decision :=", 'decision := {"allow": false, "reason": "echo is closed"} if input.tool.name == "echo"\n'
                           "\nelse := x if {\n\tx := fallback\n}\n\nfallback :=", 1)



@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))


@pytest.fixture
def serving(serve_in_background: Any, policies: Path) -> Callable[..., Awaitable[str]]:
    """Start ``serve`` on ``policies``, reloading every 50 ms; ``**policy`` adds policy settings."""

    async def start(**policy: Any) -> str:
        return await serve_in_background(policy={"path": str(policies), "reload_interval_seconds": 0.05, **policy})

    return start


async def test_changes_load_and_broken_changes_are_refused(serving: Any, policies: Path) -> None:
    async with AsyncClient(await serving(), timeout=5) as client:
        first = await client.policy_status()
        assert (await client.execute("echo", {"text": "x"})).data is not None

        original = (policies / "availability.rego").read_text()
        rewrite(policies / "availability.rego", "package toolbooth.availability\n\ndecision := {")
        refused = await until_status(client, lambda status: not status.healthy)
        assert refused.revision == first.revision and "availability.rego" in (refused.last_error or "")
        assert (await client.execute("echo", {"text": "x"})).meta.policy_revision == first.revision

        rewrite(policies / "availability.rego", original)
        rewrite(policies / "data.json", (policies / "data.json").read_text().replace(
            '"admin_console": {', '"echo": {"roles": ["admin"]},\n      "admin_console": {'))
        loaded = await until_status(client, lambda status: status.healthy and status.revision != first.revision)
        hidden = await client.execute("echo", {"text": "x"})
        assert hidden.error is not None and hidden.error.code.value == "TOOL_UNAVAILABLE"
        assert hidden.meta.policy_revision == loaded.revision


async def test_failing_policy_tests_refuse_a_change(serving: Any, policies: Path) -> None:
    async with AsyncClient(await serving(reload_requires_tests=True), timeout=5) as client:
        first = await client.policy_status()
        rewrite(policies / "gate_test.rego", "package toolbooth.gate_test\n\nimport rego.v1\n\n"
                                            "test_always_fails if false\n")
        refused = await until_status(client, lambda status: not status.healthy)
        assert refused.revision == first.revision
        assert "policy tests" in (refused.last_error or "") and "test_always_fails" in (refused.last_error or "")


async def test_policy_status_command(serving: Any, policies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = await serving()
    assert await asyncio.to_thread(main, ["policy", "status", "--target", target]) == 0
    healthy = capsys.readouterr().out
    assert healthy.startswith("revision    sha256:") and f"source      directory {policies}" in healthy

    rewrite(policies / "authz.rego", "package toolbooth.authz\n\ndecision := {")
    async with AsyncClient(target, timeout=5) as client:
        await until_status(client, lambda status: not status.healthy)
    assert await asyncio.to_thread(main, ["policy", "status", "--target", target, "--output", "json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["revision"] in healthy and "authz.rego" in document["last_error"]


async def test_a_meter_looking_back_further_than_the_history_is_kept_is_refused(serve_in_background: Any,
                                                                                policies: Path) -> None:
    target = await serve_in_background(policy={"path": str(policies), "reload_interval_seconds": 0.05},
                                       store={"history_retention_hours": 1})
    async with AsyncClient(target, timeout=5) as client:
        first = await client.policy_status()
        data = json.loads((policies / "data.json").read_text())
        data["toolbooth"]["history"]["meters"]["writes_per_principal"]["window_seconds"] = 7200
        rewrite(policies / "data.json", json.dumps(data))
        refused = await until_status(client, lambda status: not status.healthy)
        assert refused.revision == first.revision
        assert refused.last_error == ("meter 'writes_per_principal' of the policy looks back 7200 s, longer than the "
                                      "call history is kept (3600 s: store.history_retention_hours); shorten its "
                                      "window_seconds or raise store.history_retention_hours")
        assert (await client.execute("echo", {"text": "x"})).meta.policy_revision == first.revision
