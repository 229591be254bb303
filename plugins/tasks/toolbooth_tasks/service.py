"""What the two tools do: resolve and store a preview; render it for an approver; create its task once.

A preview belongs to the principal (id and tenant) that made it and to the conversation it was made in;
any other caller, or the same caller in another conversation, is told there is no such preview — the same
answer as for an unknown id, so that ids cannot be probed. ``create_task`` creates the approved rendering
(``ctx.approved_preview``) or, when no approval was asked for, the stored one, after checking again that the
caller may still use the project and that the assignee is still of its workspace.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TypeVar

import rfc8785

from sidecar.plugin import ErrorCode, ToolContext, ToolError
from toolbooth_tasks import config
from toolbooth_tasks.directory import Person, Resolved
from toolbooth_tasks.models import (
    Assignee,
    CreatedTask,
    CreateTaskInput,
    CreateTaskOutput,
    CreateTaskPreviewInput,
    CreateTaskPreviewOutput,
    ProjectRef,
    ProposedTask,
    TaskRendering,
    TaskWarning,
)
from toolbooth_tasks.store import StoredPreview, StoreUnavailable, TaskRow, TaskStore

__all__ = ["commit", "make_preview", "preview_hash", "render"]

T = TypeVar("T")


def preview_hash(task: ProposedTask) -> str:
    """``sha256:`` + hex of the task's RFC 8785 canonical JSON: equal tasks have equal hashes."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(task.model_dump(mode="json"))).hexdigest()


async def make_preview(args: CreateTaskPreviewInput, ctx: ToolContext) -> CreateTaskPreviewOutput:
    """Resolve ``args`` into the task it would create, store it as a preview of the caller's and return it."""
    now = time.time()
    expires_at = now + config.settings(ctx).preview_ttl_seconds
    resolved = _project(ctx, args.project_id, ErrorCode.RESOURCE_NOT_FOUND)
    person = _assignee(resolved, args.assignee_id)
    task = ProposedTask(
        title=args.title, description=args.description, due_at=args.due_at, priority=args.priority,
        assignee=None if person is None else Assignee(id=args.assignee_id or "", display_name=person.display_name),
        project=ProjectRef(id=args.project_id, name=resolved.project.name))
    rendering = TaskRendering(preview_id=f"tp_{secrets.token_hex(16)}", preview_hash=preview_hash(task), task=task,
                              warnings=_warnings(args.due_at, person, now), expires_at=_stamp(expires_at))
    stored = StoredPreview(rendering.preview_id, ctx.principal.id, ctx.principal.tenant, ctx.conversation_id,
                           rendering.preview_hash, rendering.model_dump_json(), now, expires_at)
    await _guarded(_store(ctx).save_preview(stored), "nothing was stored")
    return CreateTaskPreviewOutput.model_validate(rendering.model_dump())


async def render(args: CreateTaskInput, ctx: ToolContext) -> TaskRendering:
    """What ``create_task`` will create for ``args``: the caller's stored, unexpired preview. No effect."""
    stored = await _owned(_store(ctx), args.preview_id, ctx)
    return TaskRendering.model_validate_json(stored.rendering)


async def commit(args: CreateTaskInput, ctx: ToolContext) -> CreateTaskOutput:
    """Create the task of the caller's preview ``args.preview_id`` — the approved rendering, if approved — once."""
    store = _store(ctx)
    stored = await _owned(store, args.preview_id, ctx)
    approved = ctx.approved_preview
    rendering = TaskRendering.model_validate_json(stored.rendering) if approved is None else (
        TaskRendering.model_validate(approved))
    if rendering.preview_id != stored.preview_id:
        raise ToolError(ErrorCode.INVALID_ARGUMENT, "the approval is for another preview; nothing was created",
                        field="preview_id")
    task = rendering.task
    resolved = _project(ctx, task.project.id, ErrorCode.PERMISSION_DENIED)
    _assignee(resolved, None if task.assignee is None else task.assignee.id)
    row = TaskRow(f"task_{secrets.token_hex(8)}", stored.preview_id, ctx.principal.tenant, ctx.principal.id,
                  task.project.id, task.title, task.description, None if task.assignee is None else task.assignee.id,
                  task.due_at, task.priority, time.time())
    made = await _guarded(store.create(row), "the task may or may not have been created; retry with the same key")
    return CreateTaskOutput(created=made.task_id == row.task_id, task=CreatedTask(
        id=made.task_id, title=made.title, project_id=made.project_id, assignee_id=made.assignee_id,
        due_at=made.due_at, priority=task.priority, url=f"{config.settings(ctx).base_url.rstrip('/')}/{made.task_id}"))


def _store(ctx: ToolContext) -> TaskStore:
    return config.store(config.settings(ctx))


def _project(ctx: ToolContext, project_id: str, code: ErrorCode) -> Resolved:
    resolved = config.directory(config.settings(ctx)).project(ctx.principal, project_id)
    if resolved is not None:
        return resolved
    if code is ErrorCode.PERMISSION_DENIED:
        raise ToolError(code, f"you may no longer use project {project_id!r}; nothing was created", field="preview_id")
    raise ToolError(code, f"no project {project_id!r} that you can use", field="project_id")


def _assignee(resolved: Resolved, assignee_id: str | None) -> Person | None:
    if assignee_id is None:
        return None
    person = resolved.people.get(assignee_id)
    if person is None:  # unknown, of another workspace or of another organization: one answer for all three
        raise ToolError(ErrorCode.INVALID_ARGUMENT, f"{assignee_id!r} is not a person of the workspace of project "
                        f"{resolved.project_id!r}; assign someone of that workspace", field="assignee_id")
    return person


def _warnings(due_at: str | None, person: Person | None, now: float) -> list[TaskWarning]:
    if due_at is None:
        return []
    moment = datetime.fromisoformat(due_at)
    warnings = []
    if moment.timestamp() < now:
        warnings.append(TaskWarning(code="DUE_IN_PAST", message=f"the due date {due_at} has passed"))
    outside = None if person is None else person.outside_working_hours(moment)
    if outside is not None:
        warnings.append(TaskWarning(code="OUTSIDE_WORKING_HOURS", message=f"the due date {outside}"))
    return warnings


async def _owned(store: TaskStore, preview_id: str, ctx: ToolContext) -> StoredPreview:
    stored = await _guarded(store.preview(preview_id), "nothing was created")
    principal = ctx.principal
    if stored is None or (stored.principal_id, stored.tenant, stored.conversation_id) != (
            principal.id, principal.tenant, ctx.conversation_id):
        raise ToolError(ErrorCode.INVALID_ARGUMENT, f"no preview {preview_id!r} of yours in this conversation; "
                        "make one with create_task_preview", field="preview_id")
    if stored.expires_at <= time.time():
        raise ToolError(ErrorCode.PREVIEW_EXPIRED, f"preview {preview_id!r} expired at "
                        f"{_stamp(stored.expires_at)}; make a new one with create_task_preview", field="preview_id")
    return stored


async def _guarded(pending: Awaitable[T], consequence: str) -> T:
    try:
        result = await pending
    except StoreUnavailable as exc:
        raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, f"the task store is unavailable; {consequence}") from exc
    return result


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

