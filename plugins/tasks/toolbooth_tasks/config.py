"""The plugin's settings, ``plugins.config.tasks`` of the sidecar's configuration (``TasksSettings``), and the
store and directory they name.

| key | meaning | default |
| --- | --- | --- |
| ``postgres_dsn`` | keep tasks in this PostgreSQL database | unset: SQLite |
| ``sqlite_path`` | the SQLite file | ``tasks.db`` in Toolbooth's state directory |
| ``directory`` | the directory file (YAML or JSON) | the bundled ``data/directory.yaml`` |
| ``preview_ttl_seconds`` | how long a preview can be used (1-86400) | 900 |
| ``base_url`` | a task's ``url`` is this, ``/`` and its id | ``https://tasks.example.com/tasks`` |

Each key can be set by ``TOOLBOOTH_PLUGINS__CONFIG__TASKS__<KEY>`` too. The store is made once per database;
the directory file is checked when the settings are validated, and read again whenever it changes.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from sidecar.plugin import ToolContext, default_state_dir
from toolbooth_tasks.directory import Directory, load_directory
from toolbooth_tasks.store import PostgresTasks, SqliteTasks, TaskStore

__all__ = ["TasksSettings", "directory", "reset", "settings", "store"]

_stores: dict[tuple[str, str], TaskStore] = {}
_directories: dict[tuple[str, int, int], Directory] = {}


class TasksSettings(BaseModel):
    """Where tasks are kept, who may be assigned them, how long a preview lasts, what a task's url is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    postgres_dsn: SecretStr | None = Field(default=None, min_length=1)
    sqlite_path: Path = Field(default_factory=lambda: default_state_dir() / "tasks.db")
    directory: Path | None = None
    preview_ttl_seconds: float = Field(default=900.0, ge=1, le=86_400)
    base_url: str = Field(default="https://tasks.example.com/tasks", min_length=1)

    @field_validator("directory")
    @classmethod
    def _a_valid_directory(cls, value: Path | None) -> Path | None:
        """Read now, so that a bad file stops start-up (it is read again whenever it changes)."""
        if value is not None:
            load_directory(value)
        return value


def settings(ctx: ToolContext) -> TasksSettings:
    """The settings of the call's plugin."""
    return ctx.plugin_settings(TasksSettings)


def store(configured: TasksSettings) -> TaskStore:
    """The task store the settings name."""
    dsn = configured.postgres_dsn.get_secret_value() if configured.postgres_dsn is not None else ""
    where = ("postgres", dsn) if dsn else ("sqlite", str(configured.sqlite_path))
    if where not in _stores:
        _stores[where] = PostgresTasks(dsn) if dsn else SqliteTasks(configured.sqlite_path)
    return _stores[where]


def directory(configured: TasksSettings) -> Directory:
    """The directory the settings name, as its file is now."""
    path = configured.directory
    if path is None:
        return _cached(("", 0, 0), None)
    try:
        status = path.stat()
    except OSError:
        return load_directory(path)  # raises DirectoryError, naming the file
    return _cached((str(path), status.st_mtime_ns, status.st_size), path)


def _cached(key: tuple[str, int, int], path: Path | None) -> Directory:
    if key not in _directories:
        _directories.clear()
        _directories[key] = load_directory(path)
    return _directories[key]


def reset() -> None:
    """Forget the stores and directories made so far (tests)."""
    _stores.clear()
    _directories.clear()
