"""Fixtures of the tasks plugin's tests: every test runs on SQLite and on PostgreSQL (``backend``), with its own
database; ``TasksDb`` runs SQL on it. ``SECTION`` is the plugin's ``plugins.config.tasks`` of the test (changed in
place by the fixtures and tests), ``configured()`` its settings. The sidecar fixtures are those of
``tests/integration``; ``toolbooth_gate`` is the plugin test kit's."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sidecar.plugin.fixtures import toolbooth_gate
from tests.contract.conftest import postgres
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support.postgres import PostgresServer
from toolbooth_tasks import config
from toolbooth_tasks.config import TasksSettings
from toolbooth_tasks.directory import BUNDLED

__all__ = ["SECTION", "TasksDb", "configured", "jwt_auth", "make_settings", "make_token", "postgres", "rsa_key",
           "socket_path", "toolbooth_gate"]

SECTION: dict[str, Any] = {}


def configured() -> TasksSettings:
    """The plugin's settings of the test, as the sidecar validates ``SECTION``."""
    return TasksSettings.model_validate(SECTION)


class TasksDb:
    """SQL on the database the plugin uses in this test."""

    def __init__(self, sqlite_path: Path | None, dsn: str | None) -> None:
        self.sqlite_path, self.dsn = sqlite_path, dsn

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.dsn is not None:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                cursor = conn.execute(sql.replace("?", "%s").encode(), params)
                return cursor.fetchall() if cursor.description else []
        assert self.sqlite_path is not None
        with sqlite3.connect(self.sqlite_path, isolation_level=None) as conn:
            return conn.execute(sql, params).fetchall()

    def task_count(self) -> int:
        [(count,)] = self.execute("SELECT count(*) FROM tasks")
        return int(count)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TasksDb]:
    """The plugin configured for this test's own database of each kind."""
    config.reset()
    SECTION.clear()
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = server.new_schema()
        SECTION["postgres_dsn"] = dsn
        db = TasksDb(None, dsn)
    else:
        SECTION["sqlite_path"] = str(tmp_path / "tasks" / "tasks.db")
        db = TasksDb(tmp_path / "tasks" / "tasks.db", None)
    yield db
    SECTION.clear()
    config.reset()


@pytest.fixture
def directory_file(tmp_path: Path) -> Path:
    """A copy of the bundled directory, as JSON, that the plugin uses from now on (tests may change it)."""
    from importlib import resources

    import yaml

    data = yaml.safe_load(resources.files("toolbooth_tasks").joinpath(BUNDLED).read_text(encoding="utf-8"))
    path = tmp_path / "directory.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    SECTION["directory"] = str(path)
    return path
