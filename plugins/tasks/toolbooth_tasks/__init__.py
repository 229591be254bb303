"""Toolbooth tasks plugin: the preview/commit pair ``create_task_preview`` and ``create_task``.

``create_task_preview`` resolves a task against the directory (``toolbooth_tasks.directory``) and stores it as a
preview of the caller's, in its conversation; ``create_task(preview_id)`` creates exactly that task, once. The
default approval policy holds ``create_task`` for a person's approval: the approver sees the task as
``render`` shows it, and the handler creates the approved rendering. Exposed to the sidecar through the
``toolbooth.tools`` entry point ``tasks``, which names ``PLUGIN``: the two tools and their settings,
``plugins.config.tasks`` (``toolbooth_tasks.config.TasksSettings``).
"""

from __future__ import annotations

from typing import Any

from sidecar.plugin import ErrorCode, Plugin, RetryPolicy, SideEffect, ToolContext, ToolDefinition, tool
from toolbooth_tasks import service
from toolbooth_tasks.config import TasksSettings
from toolbooth_tasks.models import (
    CreateTaskInput,
    CreateTaskOutput,
    CreateTaskPreviewInput,
    CreateTaskPreviewOutput,
    TaskRendering,
)

__all__ = [
    "PLUGIN",
    "TOOLS",
    "CreateTaskInput",
    "CreateTaskOutput",
    "CreateTaskPreviewInput",
    "CreateTaskPreviewOutput",
    "TaskRendering",
    "TasksSettings",
    "create_task",
    "create_task_preview",
    "render_task",
]

PREVIEW_DESCRIPTION = (
    "Check a task before creating it: resolves the project and the assignee's name, normalizes the due date "
    "and warns when it falls outside the assignee's working hours. Creates nothing. Show the task and the "
    "warnings to the user, then call create_task with the preview_id."
)
CREATE_DESCRIPTION = (
    "Create the task a create_task_preview call returned, exactly as previewed: pass its preview_id and an "
    "idempotency key. A person usually has to approve it first; the preview expires after its expires_at."
)


@tool(name="create_task_preview", version="1.0.0", side_effect=SideEffect.NONE,
      permissions=("tasks:preview_create",), timeout=2.0, title="Preview a task", description=PREVIEW_DESCRIPTION,
      retry=RetryPolicy(max_attempts=2, attempt_timeout=0.9,
                        retry_on=(ErrorCode.SERVICE_UNAVAILABLE, ErrorCode.TIMEOUT)))
async def create_task_preview(args: CreateTaskPreviewInput, ctx: ToolContext) -> CreateTaskPreviewOutput:
    """Validate and resolve a task and store it as a preview; no task is created."""
    return await service.make_preview(args, ctx)


async def render_task(args: CreateTaskInput, ctx: ToolContext) -> TaskRendering:
    """The task ``create_task`` will create, for its approver: the caller's stored preview."""
    return await service.render(args, ctx)


@tool(name="create_task", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE,
      permissions=("tasks:create",), timeout=5.0, title="Create a task", description=CREATE_DESCRIPTION,
      preview=render_task)
async def create_task(args: CreateTaskInput, ctx: ToolContext) -> CreateTaskOutput:
    """Create the previewed (and approved) task once."""
    return await service.commit(args, ctx)


TOOLS: list[ToolDefinition[Any, Any]] = [create_task_preview, create_task]
PLUGIN = Plugin(TOOLS, settings=TasksSettings)
