"""The plugin's configuration, from environment variables read when a tool first needs them.

| variable | meaning | default |
| --- | --- | --- |
| ``TOOLBOOTH_TASKS_POSTGRES_DSN`` | keep tasks in this PostgreSQL database | unset: SQLite |
| ``TOOLBOOTH_TASKS_DB`` | the SQLite file | ``tasks.db`` in Toolbooth's state directory |
| ``TOOLBOOTH_TASKS_DIRECTORY`` | the directory file (YAML or JSON) | the bundled ``data/directory.yaml`` |
| ``TOOLBOOTH_TASKS_PREVIEW_TTL_SECONDS`` | how long a preview can be used | 900 |
| ``TOOLBOOTH_TASKS_BASE_URL`` | a task's ``url`` is this, ``/`` and its id | ``https://tasks.example.com/tasks`` |

The store is made once per database; the directory is read again whenever its file changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.config import default_state_dir
from toolbooth_tasks.directory import Directory, load_directory
from toolbooth_tasks.store import PostgresTasks, SqliteTasks, TaskStore

__all__ = ["ConfigError", "base_url", "directory", "preview_ttl", "reset", "store"]

ENV_DSN = "TOOLBOOTH_TASKS_POSTGRES_DSN"
ENV_DB = "TOOLBOOTH_TASKS_DB"
ENV_DIRECTORY = "TOOLBOOTH_TASKS_DIRECTORY"
ENV_TTL = "TOOLBOOTH_TASKS_PREVIEW_TTL_SECONDS"
ENV_BASE_URL = "TOOLBOOTH_TASKS_BASE_URL"

_stores: dict[tuple[str, str], TaskStore] = {}
_directories: dict[tuple[str, int, int], Directory] = {}


class ConfigError(ValueError):
    """An environment variable of the plugin has a value it cannot use; the message names it."""


def store() -> TaskStore:
    """The task store the environment names."""
    dsn = os.environ.get(ENV_DSN, "").strip()
    where = ("postgres", dsn) if dsn else ("sqlite", os.environ.get(ENV_DB, "").strip()
                                            or str(default_state_dir() / "tasks.db"))
    if where not in _stores:
        _stores[where] = PostgresTasks(dsn) if dsn else SqliteTasks(Path(where[1]))
    return _stores[where]


def directory() -> Directory:
    """The directory the environment names, as its file is now."""
    named = os.environ.get(ENV_DIRECTORY, "").strip()
    if not named:
        return _cached(("", 0, 0), None)
    path = Path(named)
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


def preview_ttl() -> float:
    """Seconds a preview can be used for."""
    text = os.environ.get(ENV_TTL, "").strip() or "900"
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 86_400:
        raise ConfigError(f"{ENV_TTL} must be a number of seconds from 1 to 86400, got {text!r}")
    return seconds


def base_url() -> str:
    """What a task's url starts with."""
    return (os.environ.get(ENV_BASE_URL, "").strip() or "https://tasks.example.com/tasks").rstrip("/")


def reset() -> None:
    """Forget the stores and directories made so far (tests, or after changing the environment)."""
    _stores.clear()
    _directories.clear()
