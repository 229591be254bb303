"""The plugin as the sidecar and its operator see it: metadata, packaging, configuration, its tools through the test
kit's gate."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import toolbooth_documents
from plugins.documents.tests.support import ENV_POSTGRES_DSN, READER, Corpus, configured_section
from sidecar.plugin import ConfigError, ErrorCode, Principal, SideEffect, ToolDefinition, read_plugin_settings
from sidecar.plugin.fixtures import GateOpener
from sidecar.plugin.testing import Status
from toolbooth_documents import PLUGIN, TOOLS, read_document, search_documents
from toolbooth_documents.models import (
    ReadDocumentInput,
    ReadDocumentOutput,
    SearchDocumentsInput,
    SearchDocumentsOutput,
)
from toolbooth_documents.settings import ConfigurationError, IndexSettings

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
    assert project["entry-points"]["toolbooth.tools"] == {"documents": "toolbooth_documents:PLUGIN"}
    assert project["scripts"] == {"toolbooth-documents": "toolbooth_documents.cli:main"}


def test_installed_entry_points_load_the_tools_and_the_command() -> None:
    (tools,) = metadata.entry_points(group="toolbooth.tools", name="documents")
    assert tools.load() is PLUGIN and list(PLUGIN.tools) == TOOLS
    assert tools.dist is not None and tools.dist.name == "toolbooth-documents"
    (command,) = metadata.entry_points(group="console_scripts", name="toolbooth-documents")
    assert command.load() is toolbooth_documents.cli.main


def test_settings_are_the_plugins_section_of_the_sidecars_configuration(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": "/state"}
    config = tmp_path / "toolbooth.yaml"
    config.write_text("plugins:\n  config:\n    documents:\n      sqlite_path: /data/docs.db\n")
    settings = read_plugin_settings("documents", IndexSettings, config, env=env)
    assert settings == IndexSettings(sqlite_path=Path("/data/docs.db"))
    assert settings.describe() == "sqlite /data/docs.db"
    env[ENV_POSTGRES_DSN] = "postgresql://app:hunter2@db.internal/docs"
    settings = read_plugin_settings("documents", IndexSettings, config, env=env)
    assert settings.dsn == env[ENV_POSTGRES_DSN] and "hunter2" not in repr(settings)
    assert settings.describe() == "postgres user=app password=*** dbname=docs host=db.internal"


def test_the_default_index_is_in_the_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/state")
    assert IndexSettings().sqlite_path == Path("/state/toolbooth/documents.db")


@pytest.mark.parametrize(("section", "message"), [
    ({"postgres_dsn": "password=hunter2 nonsense"},
     "config error at plugins.config.documents.postgres_dsn: not a PostgreSQL connection string: "),
    ({"db": "/tmp/x.db"}, "config error at plugins.config.documents.db: unknown key"),
    ({"cursor_key_file": "/nonexistent/key"},
     "config error at plugins.config.documents.cursor_key_file: cannot read /nonexistent/key: No such file"),
])
def test_bad_settings_are_refused_naming_the_key_never_the_password(section: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PLUGIN.configure("documents", section)
    assert str(caught.value).startswith(message)
    assert "hunter2" not in str(caught.value)


def test_a_cursor_key_file_must_be_long_enough(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("short\n")
    with pytest.raises(ConfigError, match=f"cursor_key_file: {key} holds fewer than 16 bytes"):
        PLUGIN.configure("documents", {"cursor_key_file": str(key)})
    key.write_text("  sixteen-bytes-or-more  \n")
    settings = IndexSettings(cursor_key_file=key)
    assert settings.read_cursor_key() == b"sixteen-bytes-or-more"
    key.unlink()  # gone after start-up: the index cannot open
    with pytest.raises(ConfigurationError, match=f"plugins.config.documents.cursor_key_file: cannot read {key}"):
        settings.read_cursor_key()


async def test_through_the_kits_gate_a_caller_reads_only_what_it_may(documents: Corpus,
                                                                   toolbooth_gate: GateOpener) -> None:
    reader = Principal(id="user-1", tenant="acme", permissions=READER)
    gate = await toolbooth_gate(PLUGIN, plugin_name="documents", plugin_settings=configured_section(),
                                principal=reader)
    found = await gate.call(search_documents, {"query": "launch", "project_id": "alpha"})
    assert found.status is Status.SUCCESS, found
    assert {(hit["title"], bool(hit["snippet"])) for hit in found.data["items"]} == {
        ("Launch plan", True), ("Meeting notes", True), ("Launch budget review", False)}  # restricted: no snippet
    restricted = await gate.call(read_document, {"document_id": documents.ids["acme/alpha/budget.md"]})
    assert restricted.error is not None and restricted.error.code is ErrorCode.PERMISSION_DENIED
    other = await gate.call(read_document, {"document_id": documents.ids["acme/alpha/plan.md"]},
                            principal=reader.model_copy(update={"tenant": "globex"}))
    assert other.error is not None and other.error.code is ErrorCode.RESOURCE_NOT_FOUND
