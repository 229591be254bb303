"""The tasks tools through a real sidecar (JWT mode, the bundled policies: create_task is held for approval), on
SQLite and PostgreSQL: preview → approval → create, the approver seeing the task, one task per preview and key,
and every refusal the reference design lists for the pair."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.cli import main
from sidecar.config import Settings, load_settings
from sidecar.contract import ErrorCode, Preview, Status, ToolResult
from sidecar.tools.registry import Registry
from tests.support.approvals import policies
from tests.support.gated import World, gated
from toolbooth_tasks import PLUGIN

from .conftest import SECTION, TasksDb

pytestmark = pytest.mark.integration

TASK = {"title": "Prepare the launch checklist", "project_id": "proj-launch", "assignee_id": "u-ana",
        "due_at": "2030-07-15T20:00:00Z", "description": "Everything for Monday."}
CONVERSATION = "conv-1"


@pytest.fixture
async def world(backend: TasksDb, directory_file: Path, tmp_path: Path, make_settings: Callable[..., Settings],
                jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> AsyncIterator[World]:
    """A sidecar serving the plugin configured with ``SECTION``: the test's database, a directory file it may
    change."""
    async with gated(PLUGIN.configure("tasks", SECTION), make_settings(auth=jwt_auth), make_token,
                     tmp_path / "store.db") as w:
        yield w


async def previewed(world: World, task: dict[str, Any] = TASK, **who: Any) -> dict[str, Any]:
    result = await world.client(**who).execute("create_task_preview", task, conversation_id=CONVERSATION)
    assert result.status is Status.SUCCESS, result
    data: dict[str, Any] = result.data
    return data


async def create(world: World, preview_id: str, key: str, approval_id: str | None = None,
                 conversation: str | None = CONVERSATION, **who: Any) -> ToolResult:
    return await world.client(**who).execute("create_task", {"preview_id": preview_id}, idempotency_key=key,
                                             approval_id=approval_id, conversation_id=conversation)


async def held(world: World, task: dict[str, Any] = TASK, key: str = "create-1") -> tuple[str, Preview]:
    """A task previewed, then create_task held for approval: its preview_id and the gate's preview."""
    preview_id = (await previewed(world, task))["preview_id"]
    result = await create(world, preview_id, key)
    assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
    return preview_id, result.preview


async def approved(world: World, task: dict[str, Any] = TASK, key: str = "create-1") -> tuple[str, Preview]:
    preview_id, preview = await held(world, task, key)
    assert (await world.approver.approve(preview.preview_id, preview.preview_hash, comment="ok")).ok
    return preview_id, preview


def error_of(result: ToolResult) -> tuple[ErrorCode, str | None]:
    assert result.status is Status.ERROR and result.error is not None, result
    return result.error.code, result.error.field


# --- create_task_preview -------------------------------------------------------------------


async def test_a_preview_resolves_warns_and_creates_nothing(world: World, backend: TasksDb) -> None:
    data = await previewed(world)
    assert data["task"]["assignee"] == {"id": "u-ana", "display_name": "Ana Lima"}
    assert data["task"]["project"] == {"id": "proj-launch", "name": "Product launch"}
    assert [w["code"] for w in data["warnings"]] == ["OUTSIDE_WORKING_HOURS"]
    assert "21:00 Mon (Europe/Lisbon)" in data["warnings"][0]["message"]
    assert data["preview_hash"] == (await previewed(world))["preview_hash"]  # stable
    assert backend.task_count() == 0


async def test_a_preview_rejects_an_assignee_from_another_organization(world: World) -> None:
    result = await world.agent.execute("create_task_preview", {**TASK, "assignee_id": "u-hank"})
    assert error_of(result) == (ErrorCode.INVALID_ARGUMENT, "assignee_id")


async def test_a_preview_needs_its_permission(world: World) -> None:
    result = await world.client("rita", ("reader",)).execute("create_task_preview", TASK)
    assert error_of(result)[0] is ErrorCode.PERMISSION_DENIED


# --- create_task: approval ---------------------------------------------------------------------


async def test_execution_without_approval_is_rejected_and_the_approver_sees_the_task(
        world: World, backend: TasksDb, capsys: pytest.CaptureFixture[str]) -> None:
    preview_id, preview = await held(world)
    assert preview.rendering_json is not None and backend.task_count() == 0
    [listed] = await world.approver.previews()
    shown = json.loads(listed.rendering_json or "")
    assert shown["task"] == {"title": TASK["title"], "description": TASK["description"], "priority": "medium",
                             "assignee": {"id": "u-ana", "display_name": "Ana Lima"}, "due_at": TASK["due_at"],
                             "project": {"id": "proj-launch", "name": "Product launch"}}
    assert shown["preview_id"] == preview_id and [w["code"] for w in shown["warnings"]] == ["OUTSIDE_WORKING_HOURS"]
    bob = ["--target", world.target, "--token", world.tokens(sub="bob", roles=["approver"])]
    assert await asyncio.to_thread(main, ["previews", "list", "--long", *bob]) == 0
    out = capsys.readouterr().out
    assert '"display_name": "Ana Lima"' in out and '"name": "Product launch"' in out and TASK["title"] in out
    assert (await world.approver.approve(listed.preview_id, listed.preview_hash)).ok
    made = await create(world, preview_id, "create-1", approval_id=preview.preview_id)
    assert made.status is Status.SUCCESS, made
    assert made.data["created"] is True and made.data["task"]["assignee_id"] == "u-ana"
    assert backend.execute("SELECT title, project_id, due_at FROM tasks") == [
        (TASK["title"], "proj-launch", "2030-07-15T20:00:00Z")]


async def test_a_repeated_key_returns_the_original_task_after_a_lost_response(world: World, backend: TasksDb) -> None:
    preview_id, preview = await approved(world)
    first = await create(world, preview_id, "create-1", approval_id=preview.preview_id)
    again = await create(world, preview_id, "create-1", approval_id=preview.preview_id)
    assert first.status is again.status is Status.SUCCESS
    assert again.data == first.data and again.meta.idempotency_replayed and not first.meta.idempotency_replayed
    other_key = await create(world, preview_id, "create-2", approval_id=preview.preview_id)
    assert error_of(other_key)[0] is ErrorCode.PERMISSION_DENIED and "already used" in str(other_key.error)
    assert backend.task_count() == 1


async def test_the_same_key_with_a_different_preview_is_rejected(world: World, backend: TasksDb) -> None:
    preview_id, preview = await approved(world)
    assert (await create(world, preview_id, "create-1", approval_id=preview.preview_id)).status is Status.SUCCESS
    other_id = (await previewed(world, {**TASK, "title": "Another task"}))["preview_id"]
    other = await create(world, other_id, "create-1-held")
    assert other.preview is not None
    assert (await world.approver.approve(other.preview.preview_id, other.preview.preview_hash)).ok
    reused = await create(world, other_id, "create-1", approval_id=other.preview.preview_id)
    assert error_of(reused)[0] is ErrorCode.IDEMPOTENCY_KEY_REUSED
    assert backend.task_count() == 1


async def test_concurrent_executions_of_one_approval_make_one_task(world: World, backend: TasksDb) -> None:
    preview_id, preview = await approved(world)
    results = await asyncio.gather(*(create(world, preview_id, f"race-{n}", approval_id=preview.preview_id)
                                     for n in range(2)))
    assert sorted(r.status.value for r in results) == ["error", "success"]
    assert backend.task_count() == 1


async def test_project_access_is_rechecked_after_approval(world: World, backend: TasksDb,
                                                          directory_file: Path) -> None:
    preview_id, preview = await approved(world, {**TASK, "project_id": "proj-infra"})
    data = json.loads(directory_file.read_text())
    data["organizations"]["acme"]["workspaces"]["engineering"]["projects"]["proj-infra"]["members"] = ["bob"]
    directory_file.write_text(json.dumps(data))
    result = await create(world, preview_id, "create-1", approval_id=preview.preview_id)
    assert error_of(result) == (ErrorCode.PERMISSION_DENIED, "preview_id")
    assert backend.task_count() == 0


async def test_the_permission_is_rechecked_after_approval(world: World, backend: TasksDb) -> None:
    preview_id, preview = await approved(world)
    result = await create(world, preview_id, "create-1", approval_id=preview.preview_id, roles=("reader",))
    assert error_of(result)[0] is ErrorCode.PERMISSION_DENIED
    assert backend.task_count() == 0


@pytest.mark.parametrize(("who", "conversation"), [({"sub": "mallory"}, CONVERSATION), ({}, "conv-2"), ({}, None)],
                         ids=["another user", "another conversation", "no conversation"])
async def test_a_preview_of_another_user_or_conversation_is_refused(
        world: World, backend: TasksDb, who: dict[str, Any], conversation: str | None) -> None:
    preview_id = (await previewed(world))["preview_id"]
    result = await create(world, preview_id, "steal-1", conversation=conversation, **who)
    assert error_of(result) == (ErrorCode.INVALID_ARGUMENT, "preview_id") and result.preview is None
    assert await world.approver.previews() == []  # nothing was put before an approver
    assert backend.task_count() == 0


async def test_an_expired_preview_is_refused(world: World, backend: TasksDb) -> None:
    preview_id, preview = await approved(world)
    backend.execute("UPDATE task_previews SET expires_at = ?", (time.time() - 1,))
    result = await create(world, preview_id, "create-1", approval_id=preview.preview_id)
    assert error_of(result) == (ErrorCode.PREVIEW_EXPIRED, "preview_id")
    fresh = (await previewed(world))["preview_id"]
    backend.execute("UPDATE task_previews SET expires_at = ? WHERE preview_id = ?", (time.time() - 1, fresh))
    assert error_of(await create(world, fresh, "create-2")) == (ErrorCode.PREVIEW_EXPIRED, "preview_id")
    assert backend.task_count() == 0


async def test_an_idempotency_key_is_required(world: World, backend: TasksDb) -> None:
    preview_id, preview = await approved(world)
    result = await world.agent.execute("create_task", {"preview_id": preview_id}, conversation_id=CONVERSATION,
                                       approval_id=preview.preview_id)
    assert error_of(result)[0] is ErrorCode.INVALID_ARGUMENT and result.error is not None
    assert "idempotency" in result.error.message
    assert backend.task_count() == 0


# --- without approval: the store alone keeps one task per preview --------------------------------


async def test_without_approval_two_keys_for_one_preview_make_one_task(
        backend: TasksDb, tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
        make_token: Callable[..., str]) -> None:
    engine = policies(tmp_path / "policies")  # approval configured for another tool only
    async with gated(PLUGIN.configure("tasks", SECTION), make_settings(auth=jwt_auth), make_token,
                     tmp_path / "store.db", engine=engine) as w:
        preview_id = (await previewed(w))["preview_id"]
        results = await asyncio.gather(*(create(w, preview_id, f"key-{n}") for n in range(4)))
    assert all(r.status is Status.SUCCESS for r in results), results
    assert sorted(r.data["created"] for r in results) == [False, False, False, True]
    assert len({r.data["task"]["id"] for r in results}) == 1
    assert backend.task_count() == 1


# --- configured by the sidecar's config file -----------------------------------------------------------------


def config_file(tmp_path: Path, jwt_auth: dict[str, Any], tasks: dict[str, Any]) -> Path:
    """A sidecar config file in ``tmp_path`` with the plugin section ``tasks``."""
    path = tmp_path / "toolbooth.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"listen": [f"unix://{tmp_path}/tb.sock", "127.0.0.1:0"], "shutdown_grace_seconds": 1},
        "store": {"sqlite_path": str(tmp_path / "toolbooth.db")}, "auth": jwt_auth,
        "plugins": {"allow": ["tasks"], "config": {"tasks": tasks}}}))
    return path


async def test_a_sidecar_configured_by_file_and_variables_gives_the_plugin_its_settings(
        backend: TasksDb, tmp_path: Path, jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> None:
    path = config_file(tmp_path, jwt_auth, {**SECTION, "base_url": "https://tasks.acme.test/t/"})
    settings = load_settings(path, env={"TOOLBOOTH_PLUGINS__CONFIG__TASKS__PREVIEW_TTL_SECONDS": "120"})
    async with gated(list(Registry.for_settings(settings)), settings, make_token, tmp_path / "store.db") as w:
        before = time.time()
        data = await previewed(w)
        preview = (await create(w, data["preview_id"], "create-file")).preview
        assert preview is not None and (await w.approver.approve(preview.preview_id, preview.preview_hash)).ok
        made = await create(w, data["preview_id"], "create-file", approval_id=preview.preview_id)
    expires = datetime.fromisoformat(data["expires_at"]).timestamp()
    assert before + 119 <= expires <= time.time() + 121
    assert made.status is Status.SUCCESS, made
    assert made.data["task"]["url"] == f"https://tasks.acme.test/t/{made.data['task']['id']}"
    assert backend.task_count() == 1


def test_config_validate_refuses_a_bad_plugin_section_naming_its_key(
        tmp_path: Path, jwt_auth: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    path = config_file(tmp_path, jwt_auth, {"preview_ttl_seconds": 90_000, "sqlite_path": str(tmp_path / "t.db")})
    assert main(["config", "validate", "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "config error at plugins.config.tasks.preview_ttl_seconds: Input should be less than or equal to 86400")
    path = config_file(tmp_path, jwt_auth, {"sqlite_path": str(tmp_path / "t.db")})
    assert main(["config", "validate", "--config", str(path)]) == 0
    assert "plugins:  tasks (toolbooth-tasks" in capsys.readouterr().out
