"""Fixtures of the tasks plugin's tests: every test runs on SQLite and on PostgreSQL (``backend``), with its own
database; ``tasks_db`` runs SQL on it. The sidecar fixtures are those of ``tests/integration``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.contract.conftest import postgres
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support.postgres import PostgresServer
from toolbooth_tasks import config
from toolbooth_tasks.directory import BUNDLED

__all__ = ["TasksDb", "jwt_auth", "make_settings", "make_token", "postgres", "rsa_key", "socket_path"]


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
    monkeypatch.delenv(config.ENV_DIRECTORY, raising=False)
    monkeypatch.delenv(config.ENV_TTL, raising=False)
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = server.new_schema()
        monkeypatch.setenv(config.ENV_DSN, dsn)
        db = TasksDb(None, dsn)
    else:
        monkeypatch.delenv(config.ENV_DSN, raising=False)
        monkeypatch.setenv(config.ENV_DB, str(tmp_path / "tasks" / "tasks.db"))
        db = TasksDb(tmp_path / "tasks" / "tasks.db", None)
    yield db
    config.reset()


@pytest.fixture
def directory_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the bundled directory, as JSON, that the plugin uses from now on (tests may change it)."""
    from importlib import resources

    import yaml

    data = yaml.safe_load(resources.files("toolbooth_tasks").joinpath(BUNDLED).read_text(encoding="utf-8"))
    path = tmp_path / "directory.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setenv(config.ENV_DIRECTORY, str(path))
    return path
