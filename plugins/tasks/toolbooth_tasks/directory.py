"""The directory of organizations, workspaces, projects and people that tasks are resolved against.

A YAML (or JSON) file, ``data/directory.yaml`` of this package unless the setting ``directory`` names
another; read again when it changes. An organization is a tenant: a caller sees only the projects of the
organization whose id is its principal's tenant, and of those only the ones whose ``members`` (if set) name it.
A task's assignee must be a person of its project's workspace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from importlib import resources
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from sidecar.plugin import Principal

__all__ = ["BUNDLED", "Directory", "DirectoryError", "Person", "Project", "Resolved", "load_directory"]

BUNDLED = "data/directory.yaml"
"""The directory shipped in this package (a resource path)."""

_HOURS = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")
_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class DirectoryError(ValueError):
    """The directory file cannot be read or is not a valid directory; the message says where."""


def _zone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None
    return name


def _hours(text: str) -> str:
    match = _HOURS.match(text)
    if match is None or match.group(1, 2) >= match.group(3, 4):
        raise ValueError(f"working_hours must be HH:MM-HH:MM with the start before the end, got {text!r}")
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Person(_Strict):
    """Someone a task can be assigned to."""

    display_name: str = Field(min_length=1)
    time_zone: Annotated[str, AfterValidator(_zone)] = "UTC"
    working_hours: Annotated[str, AfterValidator(_hours)] = "09:00-17:00"
    working_days: tuple[Annotated[int, Field(ge=1, le=7)], ...] = (1, 2, 3, 4, 5)

    def outside_working_hours(self, moment: datetime) -> str | None:
        """Why ``moment`` (aware) is outside this person's working time, in their zone; ``None`` if inside."""
        local = moment.astimezone(ZoneInfo(self.time_zone))
        start, end = (time.fromisoformat(part) for part in self.working_hours.split("-"))
        stamp = f"{local:%Y-%m-%d %H:%M} {_DAY_NAMES[local.weekday()]} ({self.time_zone})"
        if local.isoweekday() not in self.working_days:
            days = ", ".join(_DAY_NAMES[day - 1] for day in sorted(self.working_days))
            return f"{stamp} is not a working day of {self.display_name} ({days})"
        if not start <= local.time().replace(tzinfo=None) <= end:
            return f"{stamp} is outside the working hours of {self.display_name} ({self.working_hours})"
        return None


class Project(_Strict):
    """A project tasks are created in."""

    name: str = Field(min_length=1)
    members: tuple[str, ...] | None = None  # principal ids that may use it; None: everyone of the organization


class _Workspace(_Strict):
    name: str = Field(min_length=1)
    projects: dict[str, Project] = {}
    people: dict[str, Person] = {}


class _Organization(_Strict):
    name: str = Field(min_length=1)
    workspaces: dict[str, _Workspace] = {}


class _File(_Strict):
    organizations: dict[str, _Organization]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A project a caller may use, with its workspace's people."""

    project_id: str
    project: Project
    workspace_id: str
    people: dict[str, Person]


@dataclass(frozen=True, slots=True)
class Directory:
    """The directory, read from ``source``."""

    source: str
    organizations: dict[str, _Organization]

    def project(self, principal: Principal, project_id: str) -> Resolved | None:
        """``project_id`` if ``principal`` may use it: of its tenant's organization, and a member if it has
        members. ``None`` otherwise — an unknown project and another tenant's look the same."""
        organization = self.organizations.get(principal.tenant)
        if organization is None:
            return None
        for workspace_id, workspace in organization.workspaces.items():
            project = workspace.projects.get(project_id)
            if project is not None:
                if project.members is not None and principal.id not in project.members:
                    return None
                return Resolved(project_id, project, workspace_id, workspace.people)
        return None


def load_directory(path: Path | None) -> Directory:
    """The directory in ``path`` (YAML or JSON), or the bundled one; ``DirectoryError`` if it is not valid."""
    source = str(path) if path is not None else f"toolbooth_tasks/{BUNDLED}"
    try:
        text = path.read_text(encoding="utf-8") if path is not None else (
            resources.files("toolbooth_tasks").joinpath(BUNDLED).read_text(encoding="utf-8"))
        parsed = _File.model_validate(yaml.safe_load(text))
    except OSError as exc:
        raise DirectoryError(f"cannot read the tasks directory {source}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise DirectoryError(f"the tasks directory {source} is not YAML or JSON: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise DirectoryError(f"the tasks directory {source} is not valid: {problems}") from None
    return Directory(source, parsed.organizations)
