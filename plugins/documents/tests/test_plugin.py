"""The plugin as the sidecar and its operator see it: metadata, packaging, configuration."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import toolbooth_documents
from sidecar.config import load_settings
from sidecar.plugin import ErrorCode, SideEffect, ToolDefinition
from toolbooth_documents import TOOLS, read_document, search_documents
from toolbooth_documents.models import (
    ReadDocumentInput,
    ReadDocumentOutput,
    SearchDocumentsInput,
    SearchDocumentsOutput,
)
from toolbooth_documents.settings import (
    ENV_CURSOR_KEY_FILE,
    ENV_DB,
    ENV_POSTGRES_DSN,
    ConfigurationError,
    IndexSettings,
)

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_tool_metadata() -> None:
    assert TOOLS == [search_documents, read_document]
    expected = {
        search_documents: ("search_documents", ("documents:search",), 3.0, SearchDocumentsInput, SearchDocumentsOutput),
        read_document: ("read_document", ("documents:read",), 2.0, ReadDocumentInput, ReadDocumentOutput),
    }
    for tool, (name, permissions, timeout, input_model, output_model) in expected.items():
        assert isinstance(tool, ToolDefinition)
        assert (tool.name, tool.version, tool.side_effect) == (name, "1.0.0", SideEffect.NONE)
        assert (tool.permissions, tool.timeout, tool.is_async) == (permissions, timeout, True)
        assert (tool.input_model, tool.output_model) == (input_model, output_model)
        assert tool.requires_idempotency_key is False
        assert tool.retry.max_attempts == 2 and ErrorCode.SERVICE_UNAVAILABLE in tool.retry.retry_on
        assert tool.plugin == "toolbooth_documents.tools" and tool.description


def test_entry_point_and_command_are_declared() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert project["name"] == "toolbooth-documents"
    assert project["entry-points"]["toolbooth.tools"] == {"documents": "toolbooth_documents:TOOLS"}
    assert project["scripts"] == {"toolbooth-documents": "toolbooth_documents.cli:main"}


def test_installed_entry_points_load_the_tools_and_the_command() -> None:
    (tools,) = metadata.entry_points(group="toolbooth.tools", name="documents")
    assert tools.load() is TOOLS and tools.dist is not None and tools.dist.name == "toolbooth-documents"
    (command,) = metadata.entry_points(group="console_scripts", name="toolbooth-documents")
    assert command.load() is toolbooth_documents.cli.main


def test_settings_come_from_the_environment() -> None:
    default = IndexSettings.from_env({"XDG_STATE_HOME": "/state"})
    assert default == IndexSettings(Path("/state/toolbooth/documents.db"))
    assert default.describe() == "sqlite /state/toolbooth/documents.db"
    env = {ENV_DB: "/data/docs.db", ENV_POSTGRES_DSN: "postgresql://app:hunter2@db.internal/docs",
           ENV_CURSOR_KEY_FILE: "/run/secrets/cursor-key"}
    settings = IndexSettings.from_env(env)
    assert settings == IndexSettings(Path("/data/docs.db"), env[ENV_POSTGRES_DSN], Path("/run/secrets/cursor-key"))
    assert settings.describe() == "postgres user=app password=*** dbname=docs host=db.internal"
    assert IndexSettings.from_env(env, db=Path("/other.db")).postgres_dsn is None  # the indexer's --db wins
    assert IndexSettings.from_env(env, postgres_dsn="dbname=x").postgres_dsn == "dbname=x"


def test_a_bad_dsn_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        IndexSettings.from_env({ENV_POSTGRES_DSN: "password=hunter2 nonsense"})
    assert str(caught.value).startswith("TBDOCS_POSTGRES_DSN: not a PostgreSQL connection string: ")
    assert "hunter2" not in str(caught.value)


def test_a_cursor_key_file_must_be_readable_and_long_enough(tmp_path: Path) -> None:
    key = tmp_path / "key"
    settings = IndexSettings(tmp_path / "db", cursor_key_file=key)
    with pytest.raises(ConfigurationError, match=f"TBDOCS_CURSOR_KEY_FILE: cannot read {key}: No such file"):
        settings.read_cursor_key()
    key.write_text("short\n")
    with pytest.raises(ConfigurationError, match="holds fewer than 16 bytes"):
        settings.read_cursor_key()
    key.write_text("  sixteen-bytes-or-more  \n")
    assert settings.read_cursor_key() == b"sixteen-bytes-or-more"


def test_the_plugins_variables_do_not_disturb_the_sidecars_settings(tmp_path: Path) -> None:
    env = {ENV_DB: str(tmp_path / "docs.db"), ENV_POSTGRES_DSN: "dbname=docs", ENV_CURSOR_KEY_FILE: "/k",
           "XDG_STATE_HOME": str(tmp_path)}
    assert load_settings(env=env).store.postgres_dsn is None
