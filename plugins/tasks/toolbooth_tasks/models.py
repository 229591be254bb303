"""Input, output and rendering models of ``create_task_preview`` and ``create_task``; their JSON schemas are
what the model sees (and, for ``TaskRendering``, what the approver sees)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "MAX_DESCRIPTION",
    "MAX_TITLE",
    "Assignee",
    "CreateTaskInput",
    "CreateTaskOutput",
    "CreateTaskPreviewInput",
    "CreateTaskPreviewOutput",
    "CreatedTask",
    "Priority",
    "ProjectRef",
    "ProposedTask",
    "TaskRendering",
    "TaskWarning",
    "canonical_timestamp",
]

MAX_TITLE = 300
MAX_DESCRIPTION = 10_000

Priority = Literal["low", "medium", "high"]

# RFC 3339 with an explicit offset: 2026-07-21T11:30:00Z, 2026-07-21T12:30:00+01:00 (seconds and fraction optional).
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})$")


def canonical_timestamp(text: str) -> str:
    """``text`` (RFC 3339 with an offset) as UTC ``YYYY-MM-DDTHH:MM:SSZ``; ``ValueError`` for anything else."""
    if not _TIMESTAMP.match(text):
        raise ValueError("must be an RFC 3339 timestamp with a time zone offset, e.g. 2026-07-21T11:30:00Z")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a valid date and time") from None
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _title(text: str) -> str:
    stripped = text.strip()
    if not stripped:
        raise ValueError("must not be empty or only whitespace")
    return stripped


Timestamp = Annotated[str, AfterValidator(canonical_timestamp)]
_ID = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateTaskPreviewInput(_Model):
    """A task to validate and resolve, without creating it."""

    title: Annotated[str, AfterValidator(_title)] = Field(
        min_length=1, max_length=MAX_TITLE, description=f"Short task title, 1 to {MAX_TITLE} characters.")
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION, description="What is to be done.")
    assignee_id: Annotated[str, _ID] | None = Field(
        default=None, description="Id of the person to assign, e.g. 'u-ana'; a person of the project's workspace.")
    due_at: Timestamp | None = Field(
        default=None, description="When the task is due: RFC 3339 with an offset, e.g. '2026-07-21T15:00:00Z'.")
    project_id: Annotated[str, _ID] = Field(description="Id of the project the task belongs to, e.g. 'proj-launch'.")
    priority: Priority = Field(default="medium", description="low, medium (the default) or high.")


class Assignee(_Model):
    id: str
    display_name: str


class ProjectRef(_Model):
    id: str
    name: str


class ProposedTask(_Model):
    """The task as it would be created: identifiers resolved, values normalized."""

    title: str
    description: str | None = None
    assignee: Assignee | None = None
    due_at: str | None = None
    project: ProjectRef
    priority: Priority


class TaskWarning(_Model):
    code: str = Field(description="e.g. OUTSIDE_WORKING_HOURS, DUE_IN_PAST")
    message: str


class CreateTaskPreviewOutput(_Model):
    """A stored preview: pass ``preview_id`` to ``create_task`` to create exactly this task."""

    preview_id: str
    preview_hash: str = Field(description="sha256 of the proposed task's canonical JSON: equal tasks, equal hashes.")
    task: ProposedTask
    warnings: list[TaskWarning]
    expires_at: str = Field(description="RFC 3339 UTC; create_task refuses the preview after it.")


class CreateTaskInput(_Model):
    """Create the task a preview proposed. The approval and the idempotency key travel with the call itself
    (``approval_id``, ``idempotency_key``), not in the arguments."""

    # No length bounds: the schema stays usable in OpenAI's strict mode; an unknown id is refused by the tool.
    preview_id: str = Field(description="The preview_id create_task_preview returned.")


class TaskRendering(_Model):
    """What ``create_task`` will create, as its approver sees it (and as it is then created)."""

    preview_id: str
    preview_hash: str
    task: ProposedTask
    warnings: list[TaskWarning]
    expires_at: str


class CreatedTask(_Model):
    id: str
    title: str
    project_id: str
    assignee_id: str | None = None
    due_at: str | None = None
    priority: Priority
    url: str


class CreateTaskOutput(_Model):
    """The task; ``created`` is false when the preview had already been used and this is the task it made.
    A replay of a call with the same idempotency key says so in the result's ``meta.idempotency_replayed``."""

    task: CreatedTask
    created: bool
