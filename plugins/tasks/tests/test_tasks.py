"""The tasks tools called directly, on SQLite and PostgreSQL: validation, the directory, warnings, the preview
hash, whose a preview is, expiry, and one task per preview under concurrent calls; the pair through the test kit's
gate. Also metadata and packaging."""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sidecar.plugin import ConfigError, ErrorCode, Principal, SideEffect, ToolContext, ToolError
from sidecar.plugin.fixtures import GateOpener
from sidecar.plugin.testing import Status, make_context
from toolbooth_tasks import (
    PLUGIN,
    TOOLS,
    CreateTaskInput,
    CreateTaskOutput,
    CreateTaskPreviewInput,
    CreateTaskPreviewOutput,
    config,
    create_task,
    create_task_preview,
    render_task,
)
from toolbooth_tasks.directory import DirectoryError, load_directory

from .conftest import SECTION, TasksDb, configured

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
ALICE = Principal(id="alice", tenant="acme", roles=("developer",))
TASK = {"title": "Prepare the launch checklist", "project_id": "proj-launch", "assignee_id": "u-ana",
        "due_at": "2030-07-15T10:00:00Z", "priority": "high", "description": "Everything for Monday."}
MONDAY_NIGHT = "2030-07-15T20:00:00Z"  # 21:00 in Lisbon
SATURDAY = "2030-07-13T10:00:00Z"


def context(principal: Principal = ALICE, conversation: str | None = "c-1",
            approved: dict[str, Any] | None = None) -> ToolContext:
    """The context the sidecar gives ``create_task`` (and its preview), with the plugin's settings of the test."""
    return make_context(create_task, principal=principal, idempotency_key="k-1", conversation_id=conversation,
                        approved_preview=approved, settings=configured(), seconds=5)


async def preview(ctx: ToolContext | None = None, **changes: Any) -> CreateTaskPreviewOutput:
    args = CreateTaskPreviewInput.model_validate({**TASK, **changes})
    output = await create_task_preview(args, ctx or context())
    assert isinstance(output, CreateTaskPreviewOutput)
    return output


async def create(preview_id: str, ctx: ToolContext | None = None) -> CreateTaskOutput:
    output = await create_task(CreateTaskInput(preview_id=preview_id), ctx or context())
    assert isinstance(output, CreateTaskOutput)
    return output


async def refused(pending: Any) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await pending
    return caught.value


# --- create_task_preview: the seed's important tests ---------------------------------------


async def test_a_preview_does_not_create_a_task(backend: TasksDb) -> None:
    output = await preview()
    assert backend.task_count() == 0
    [(stored,)] = backend.execute("SELECT count(*) FROM task_previews WHERE preview_id = ?", (output.preview_id,))
    assert stored == 1


async def test_the_assignee_id_resolves_to_a_display_name(backend: TasksDb) -> None:
    output = await preview()
    assert output.task.assignee is not None
    assert (output.task.assignee.id, output.task.assignee.display_name) == ("u-ana", "Ana Lima")
    assert (output.task.project.id, output.task.project.name) == ("proj-launch", "Product launch")
    assert output.task.priority == "high" and output.task.due_at == "2030-07-15T10:00:00Z"
    assert output.warnings == []


@pytest.mark.parametrize(("due_at", "expected"), [
    (MONDAY_NIGHT, "2030-07-15 21:00 Mon (Europe/Lisbon) is outside the working hours of Ana Lima (09:00-17:30)"),
    (SATURDAY, "2030-07-13 11:00 Sat (Europe/Lisbon) is not a working day of Ana Lima (Mon, Tue, Wed, Thu, Fri)"),
])
async def test_a_due_date_outside_working_hours_is_warned(backend: TasksDb, due_at: str, expected: str) -> None:
    output = await preview(due_at=due_at)
    assert [(w.code, w.message) for w in output.warnings] == [("OUTSIDE_WORKING_HOURS", f"the due date {expected}")]


async def test_working_hours_are_the_assignees_own(backend: TasksDb) -> None:
    # 01:00 UTC on a Tuesday is 10:00 in Tokyo: inside Kenji's hours, outside Ana's.
    assert (await preview(assignee_id="u-kenji", due_at="2030-07-16T01:00:00Z")).warnings == []
    assert [w.code for w in (await preview(due_at="2030-07-16T01:00:00Z")).warnings] == ["OUTSIDE_WORKING_HOURS"]


async def test_a_past_due_date_is_warned(backend: TasksDb) -> None:
    output = await preview(due_at="2020-07-15T10:00:00Z")
    assert [w.code for w in output.warnings] == ["DUE_IN_PAST"]


@pytest.mark.parametrize("assignee", ["u-hank", "u-sam", "u-nobody"])  # another organization, workspace, unknown
async def test_an_assignee_from_another_organization_is_rejected(backend: TasksDb, assignee: str) -> None:
    await preview()
    error = await refused(preview(assignee_id=assignee))
    assert (error.code, error.field) == (ErrorCode.INVALID_ARGUMENT, "assignee_id")
    assert error.message == (f"{assignee!r} is not a person of the workspace of project 'proj-launch'; "
                             "assign someone of that workspace")
    assert backend.execute("SELECT count(*) FROM task_previews") == [(1,)]  # the valid one only


async def test_the_preview_hash_is_stable(backend: TasksDb) -> None:
    first, second = await preview(), await preview(due_at="2030-07-15T11:00:00+01:00", title="  " + TASK["title"])
    assert first.preview_id != second.preview_id
    assert first.preview_hash == second.preview_hash and first.preview_hash.startswith("sha256:")
    assert (await preview(title="Another title")).preview_hash != first.preview_hash
    assert (await preview(priority="low")).preview_hash != first.preview_hash


@pytest.mark.parametrize("project", ["proj-lab", "proj-nothing", "proj-infra-x"])  # globex's, unknown
async def test_a_project_outside_the_callers_tenant_is_not_found(backend: TasksDb, project: str) -> None:
    error = await refused(preview(project_id=project, assignee_id=None))
    assert (error.code, error.field) == (ErrorCode.RESOURCE_NOT_FOUND, "project_id")
    assert error.message == f"no project {project!r} that you can use"


async def test_a_project_with_members_is_only_theirs(backend: TasksDb) -> None:
    assert (await preview(project_id="proj-infra")).task.project.name == "Infrastructure"
    carol = Principal(id="carol", tenant="acme", roles=("developer",))
    error = await refused(preview(context(carol), project_id="proj-infra"))
    assert error.code is ErrorCode.RESOURCE_NOT_FOUND


@pytest.mark.parametrize(("changes", "field"), [
    ({"title": ""}, "title"),
    ({"title": "   "}, "title"),
    ({"title": "x" * 301}, "title"),
    ({"due_at": "2030-07-15"}, "due_at"),
    ({"due_at": "2030-07-15T10:00:00"}, "due_at"),  # no offset
    ({"due_at": "2030-02-30T10:00:00Z"}, "due_at"),
    ({"due_at": "tomorrow"}, "due_at"),
    ({"priority": "urgent"}, "priority"),
    ({"project_id": ""}, "project_id"),
    ({"assignee_id": "u ana"}, "assignee_id"),
    ({"assignee": "u-ana"}, "assignee"),
])
def test_invalid_arguments_are_rejected(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CreateTaskPreviewInput.model_validate({**TASK, **changes})
    assert [e["loc"][0] for e in caught.value.errors()] == [field]


def test_a_timestamp_without_offset_says_what_is_expected() -> None:
    with pytest.raises(ValidationError) as caught:
        CreateTaskPreviewInput.model_validate({**TASK, "due_at": "2030-07-15 10:00"})
    assert "RFC 3339 timestamp with a time zone offset, e.g. 2026-07-21T11:30:00Z" in str(caught.value)


def test_a_title_of_300_characters_and_no_priority_are_fine() -> None:
    args = CreateTaskPreviewInput.model_validate({"title": "x" * 300, "project_id": "proj-launch"})
    assert args.priority == "medium" and args.due_at is None and args.assignee_id is None


# --- create_task called directly --------------------------------------------------------------


async def test_create_makes_exactly_the_previewed_task(backend: TasksDb) -> None:
    shown = await preview()
    made = await create(shown.preview_id)
    assert made.created is True
    task = made.task
    assert (task.title, task.project_id, task.assignee_id, task.due_at, task.priority) == (
        TASK["title"], "proj-launch", "u-ana", "2030-07-15T10:00:00Z", "high")
    assert task.url == f"https://tasks.example.com/tasks/{task.id}"
    assert backend.execute("SELECT title, description, created_by, tenant FROM tasks") == [
        (TASK["title"], TASK["description"], "alice", "acme")]


async def test_a_used_preview_returns_its_task_and_creates_no_other(backend: TasksDb) -> None:
    shown = await preview()
    first = await create(shown.preview_id)
    again = await create(shown.preview_id)
    assert (again.created, again.task) == (False, first.task)
    assert backend.task_count() == 1


async def test_concurrent_creates_of_one_preview_make_one_task(backend: TasksDb) -> None:
    shown = await preview()
    results = await asyncio.gather(*(create(shown.preview_id) for _ in range(8)))
    assert sum(r.created for r in results) == 1
    assert len({r.task.id for r in results}) == 1
    assert backend.task_count() == 1


@pytest.mark.parametrize("ctx", [
    context(Principal(id="mallory", tenant="acme", roles=("developer",))),
    context(Principal(id="alice", tenant="globex", roles=("developer",))),
    context(conversation="c-2"),
    context(conversation=None),
], ids=["another user", "another tenant", "another conversation", "no conversation"])
async def test_a_preview_of_another_user_or_conversation_is_refused(backend: TasksDb, ctx: ToolContext) -> None:
    shown = await preview()
    for pending in (create(shown.preview_id, ctx), render_task(CreateTaskInput(preview_id=shown.preview_id), ctx)):
        error = await refused(pending)
        assert (error.code, error.field) == (ErrorCode.INVALID_ARGUMENT, "preview_id")
        assert error.message == (f"no preview {shown.preview_id!r} of yours in this conversation; "
                                 "make one with create_task_preview")
    unknown = await refused(create("tp_unknown"))
    assert unknown.message == ("no preview 'tp_unknown' of yours in this conversation; "
                               "make one with create_task_preview")
    assert backend.task_count() == 0


async def test_an_expired_preview_is_refused(backend: TasksDb) -> None:
    shown = await preview()
    backend.execute("UPDATE task_previews SET expires_at = ?", (time.time() - 1,))
    error = await refused(create(shown.preview_id))
    assert (error.code, error.field) == (ErrorCode.PREVIEW_EXPIRED, "preview_id")
    assert "make a new one with create_task_preview" in error.message
    assert backend.task_count() == 0


async def test_previews_live_as_long_as_configured(backend: TasksDb) -> None:
    SECTION["preview_ttl_seconds"] = 60
    shown = await preview()
    [(created, expires)] = backend.execute("SELECT created_at, expires_at FROM task_previews")
    assert expires - created == pytest.approx(60)
    assert shown.expires_at.endswith("Z")


@pytest.mark.parametrize(("section", "message"), [
    ({"preview_ttl_seconds": "forever"},
     "config error at plugins.config.tasks.preview_ttl_seconds: Input should be a valid number, unable to parse "
     "string as a number"),
    ({"preview_ttl_seconds": 0},
     "config error at plugins.config.tasks.preview_ttl_seconds: Input should be greater than or equal to 1"),
    ({"base_url": ""}, "config error at plugins.config.tasks.base_url: String should have at least 1 character"),
    ({"postgres_dsn": ""}, "config error at plugins.config.tasks.postgres_dsn: Value should have at least 1 item "
                           "after validation, not 0"),
    ({"db": "/tmp/tasks.db"}, "config error at plugins.config.tasks.db: unknown key"),
    ({"directory": "/nonexistent/directory.yaml"}, "config error at plugins.config.tasks.directory: cannot read the "
                                                   "tasks directory /nonexistent/directory.yaml: No such file or "
                                                   "directory"),
])
def test_bad_settings_are_refused_naming_the_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PLUGIN.configure("tasks", section)
    assert str(caught.value) == message


async def test_the_approved_rendering_is_what_is_created(backend: TasksDb) -> None:
    shown = await preview()
    rendering = await render_task(CreateTaskInput(preview_id=shown.preview_id), context())
    approved = rendering.model_dump(mode="json")
    backend.execute("UPDATE task_previews SET rendering = ?", (json.dumps({**approved, "task": {
        **approved["task"], "title": "Changed in the store"}}),))
    made = await create(shown.preview_id, context(approved=approved))
    assert made.task.title == TASK["title"]


async def test_project_access_is_checked_again_when_creating(backend: TasksDb, directory_file: Path) -> None:
    shown = await preview(project_id="proj-infra")
    data = json.loads(directory_file.read_text())
    data["organizations"]["acme"]["workspaces"]["engineering"]["projects"]["proj-infra"]["members"] = ["bob"]
    directory_file.write_text(json.dumps(data))
    error = await refused(create(shown.preview_id))
    assert error.code is ErrorCode.PERMISSION_DENIED
    assert error.message == "you may no longer use project 'proj-infra'; nothing was created"
    assert backend.task_count() == 0


async def test_an_unreachable_database_is_service_unavailable() -> None:
    from tests.support.postgres import ADMIN_DSN, closed_port_dsn

    config.reset()
    SECTION["postgres_dsn"] = closed_port_dsn(ADMIN_DSN + "?password=pw-secret")
    error = await refused(preview())
    assert error.code is ErrorCode.SERVICE_UNAVAILABLE
    assert error.message == "the task store is unavailable; nothing was stored"
    config.reset()
    SECTION.clear()


# --- the directory file -------------------------------------------------------------------


def test_a_bad_directory_file_is_named_with_its_problem(tmp_path: Path) -> None:
    path = tmp_path / "directory.yaml"
    path.write_text("organizations:\n  acme:\n    name: Acme\n    workspaces:\n      w:\n        name: W\n"
                    "        people:\n          u: {display_name: U, time_zone: Mars/Olympus}\n")
    with pytest.raises(DirectoryError) as caught:
        load_directory(path)
    assert str(caught.value) == (f"the tasks directory {path} is not valid: organizations.acme.workspaces.w.people.u."
                                 "time_zone: Value error, unknown time zone 'Mars/Olympus'")
    with pytest.raises(DirectoryError, match="cannot read the tasks directory"):
        load_directory(tmp_path / "missing.yaml")


# --- metadata and packaging -----------------------------------------------------------------


async def test_through_the_gate_a_task_is_created_once_approved(backend: TasksDb, toolbooth_gate: GateOpener) -> None:
    gate = await toolbooth_gate(PLUGIN, plugin_name="tasks", plugin_settings=SECTION, principal=ALICE)
    shown = await gate.call(create_task_preview, TASK, conversation_id="c-1")
    assert shown.status is Status.SUCCESS, shown
    args = {"preview_id": shown.data["preview_id"]}
    held = await gate.call(create_task, args, idempotency_key="k-1", conversation_id="c-1")
    assert held.status is Status.APPROVAL_REQUIRED and backend.task_count() == 0
    approval_id = await gate.approve(held)
    made = await gate.call(create_task, args, idempotency_key="k-1", conversation_id="c-1", approval_id=approval_id)
    assert made.status is Status.SUCCESS and backend.task_count() == 1


def test_tool_metadata() -> None:
    assert (create_task_preview.side_effect, create_task_preview.permissions, create_task_preview.timeout) == (
        SideEffect.NONE, ("tasks:preview_create",), 2.0)
    assert create_task_preview.retry.max_attempts == 2
    assert create_task_preview.retry.retry_on == {ErrorCode.SERVICE_UNAVAILABLE, ErrorCode.TIMEOUT}
    assert (create_task.side_effect, create_task.permissions, create_task.timeout) == (
        SideEffect.INTERNAL_REVERSIBLE, ("tasks:create",), 5.0)
    assert create_task.requires_idempotency_key and create_task.preview is render_task
    assert create_task.retry.max_attempts == 1


def test_entry_point_is_declared_and_installed() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["toolbooth.tools"] == {"tasks": "toolbooth_tasks:PLUGIN"}
    (entry_point,) = metadata.entry_points(group="toolbooth.tools", name="tasks")
    assert entry_point.load() is PLUGIN and PLUGIN.tools == (create_task_preview, create_task)
    assert PLUGIN.settings is config.TasksSettings and list(PLUGIN.tools) == TOOLS


def test_create_tasks_schema_allows_strict_mode() -> None:
    from sidecar.api.strict import strict_problem

    assert strict_problem(CreateTaskInput.model_json_schema()) is None
