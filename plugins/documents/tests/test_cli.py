"""``toolbooth-documents``: index, re-index, the sample corpus, delete, list, and what a user sees on mistakes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sidecar.plugin import Principal, ToolContext
from sidecar.plugin.testing import make_context
from tests.support.postgres import PostgresServer, closed_port_dsn
from tests.support.tables import table_rows
from toolbooth_documents.cli import SAMPLE_PROJECT, SAMPLE_TENANT, main, sample_directory
from toolbooth_documents.index import open_index
from toolbooth_documents.models import ReadDocumentInput, SearchDocumentsInput
from toolbooth_documents.records import document_id
from toolbooth_documents.settings import IndexSettings
from toolbooth_documents.tools import read, search


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(list(argv))
    assert caught.value.code == 2
    return capsys.readouterr().err


def context(tenant: str) -> ToolContext:
    return make_context(principal=Principal(id="u", tenant=tenant), seconds=5)


def test_index_reports_each_file_and_a_changed_file_gets_a_new_version(
        settings: IndexSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "plan.md").write_text("# Plan\nfirst\n")
    (docs / "notes.txt").write_text("notes\n")
    plan, notes = document_id("acme", "alpha", "plan.md"), document_id("acme", "alpha", "notes.txt")
    code, out, err = run(capsys, "index", str(docs), "--tenant", "acme", "--project", "alpha")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"added      {notes}  v1  notes.txt  'notes'",
        f"added      {plan}  v1  plan.md  'Plan'",
        f"indexed 2 file(s) into {settings.describe()} (tenant acme, project alpha): 2 added, 0 updated, 0 unchanged",
    ]
    (docs / "plan.md").write_text("# Plan\nsecond\n")
    code, out, _ = run(capsys, "index", str(docs), "--tenant", "acme", "--project", "alpha", "--restricted")
    assert code == 0
    assert out.splitlines()[:2] == [f"updated    {notes}  v2  notes.txt  'notes'  (restricted)",
                                    f"updated    {plan}  v2  plan.md  'Plan'  (restricted)"]
    code, out, _ = run(capsys, "index", str(docs), "--tenant", "acme", "--project", "alpha", "--restricted")
    assert out.splitlines()[0] == f"unchanged  {notes}  v2  notes.txt  'notes'  (restricted)"
    assert out.splitlines()[-1].endswith(": 0 added, 0 updated, 2 unchanged")


def test_a_file_that_cannot_be_used_is_skipped_and_the_exit_code_says_so(
        settings: IndexSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "good.md").write_text("# Good\n")
    (tmp_path / "bad.md").write_bytes(b"# Bad \xff\n")
    code, out, err = run(capsys, "index", str(tmp_path), "--tenant", "acme", "--project", "alpha")
    assert code == 1
    assert err == f"skipped {tmp_path / 'bad.md'}: not UTF-8 text (byte 6)\n"
    assert "'Good'" in out and out.splitlines()[-1].endswith("1 added, 0 updated, 0 unchanged; 1 skipped")


def test_the_sample_corpus_is_indexed_for_the_dev_principal_and_found(
        settings: IndexSettings, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "index", "--sample")
    assert code == 0 and (SAMPLE_TENANT, SAMPLE_PROJECT) == ("dev", "toolbooth")
    assert out.splitlines()[-1].endswith("(tenant dev, project toolbooth): 7 added, 0 updated, 0 unchanged")
    assert sum("(restricted)" in line for line in out.splitlines()) == 1
    index = open_index(settings)
    found = asyncio.run(search(index, SearchDocumentsInput(query="approval hash"), context("dev")))
    assert found.items[0].title == "Approvals" and "hash" in found.items[0].snippet
    stages = asyncio.run(read(index, ReadDocumentInput(document_id=document_id("dev", "toolbooth",
                                                                               "chain-of-stages.md"),
                                                       max_characters=1000), context("dev")))
    assert stages.title == "The chain of stages" and stages.truncated and stages.next_cursor
    assert asyncio.run(search(index, SearchDocumentsInput(query="approval"), context("acme"))).items == []


def test_the_sample_corpus_ships_in_the_package() -> None:
    names = sorted(path.name for path in sample_directory().iterdir())
    assert names == ["approvals.md", "chain-of-stages.md", "errors.md", "idempotency.md", "incident-runbook.md",
                     "overview.md", "writing-plugins.md"]


def test_delete_and_list(settings: IndexSettings, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "index", "--sample", "--tenant", "acme", "--project", "docs")
    doc = document_id("acme", "docs", "approvals.md")
    code, out, _ = run(capsys, "list", "--tenant", "acme")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 8
    assert lines[0].split() == ["DOCUMENT", "ID", "TENANT", "PROJECT", "VERSION", "RESTRICTED", "UPDATED", "AT",
                                "TITLE"]
    assert lines[1].split() == [doc, "acme", "docs", "1", "no", "2026-05-20T08:15:00Z", "Approvals"]
    code, out, _ = run(capsys, "delete", doc)
    assert (code, out) == (0, f"deleted {doc} v1 (tenant acme, project docs): 'Approvals'\n")
    code, out, err = run(capsys, "delete", doc)
    assert (code, out, err) == (1, "", f"toolbooth-documents: error: there is no document {doc} in "
                                       f"{settings.describe()}\n")
    assert len(run(capsys, "list", "--project", "docs")[1].splitlines()) == 7
    assert run(capsys, "list", "--tenant", "globex")[1].splitlines()[1:] == []


def test_db_option_names_another_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.db"
    code, out, _ = run(capsys, "index", "--sample", "--db", str(other))
    assert code == 0 and f"into sqlite {other} " in out and other.exists()
    assert len(run(capsys, "list", "--db", str(other))[1].splitlines()) == 8


@pytest.mark.parametrize(("argv", "message"), [
    (["index"], "give a directory or --sample (not both)"),
    (["index", ".", "--sample"], "give a directory or --sample (not both)"),
    (["index", "."], "--tenant and --project are required with a directory"),
    (["index", ".", "--tenant", "acme"], "--tenant and --project are required with a directory"),
    (["index", ".", "--tenant", "ac me", "--project", "p"], "tenant 'ac me' must be 1-64 letters, digits"),
    (["index", ".", "--tenant", "acme", "--project", "../p"], "project '../p' must be 1-64 letters, digits"),
    (["index", "/no/such/dir", "--tenant", "acme", "--project", "p"], "/no/such/dir is not a directory"),
    (["delete", "doc_123"], "'doc_123' is not a document id ('doc_' and 24 hexadecimal digits)"),
    (["index", "--sample", "--db", "x.db", "--postgres-dsn", "host=x"], "not allowed with argument"),
    ([], "the following arguments are required: COMMAND"),
])
def test_usage_errors_say_what_is_wrong(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert message in usage_error(capsys, *argv)


def test_a_bad_dsn_is_an_error_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "list", "--postgres-dsn", "host=x password=hunter2 bogus=1")
    assert code == 2
    assert err == ('toolbooth-documents: error: --postgres-dsn: not a PostgreSQL connection string: '
                   'invalid connection option "bogus"\n')


def test_the_index_of_the_sidecars_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"plugins:\n  config:\n    documents:\n      sqlite_path: {tmp_path / 'configured.db'}\n")
    code, out, _ = run(capsys, "index", "--sample", "--config", str(config))
    assert code == 0 and f"into sqlite {tmp_path / 'configured.db'} " in out
    assert len(run(capsys, "list", "--config", str(config))[1].splitlines()) == 8


@pytest.mark.parametrize(("yaml", "message"), [
    ("plugins:\n  config:\n    documents:\n      sqlite: x.db\n",
     "config error at plugins.config.documents.sqlite: unknown key"),
    ("plugins:\n  config:\n    documents:\n      postgres_dsn: 'password=hunter2 nonsense'\n",
     "config error at plugins.config.documents.postgres_dsn: not a PostgreSQL connection string: "),
    ("plugins: [documents]\n", "config error at plugins: Input should be a valid dictionary"),
])
def test_a_bad_config_file_is_an_error_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      yaml: str, message: str) -> None:
    config = tmp_path / "toolbooth.yaml"
    config.write_text(yaml)
    code, _, err = run(capsys, "list", "--config", str(config))
    assert code == 2 and err.startswith(f"toolbooth-documents: error: {message}") and "hunter2" not in err


def test_an_unreachable_database_is_an_error(postgres: PostgresServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "list", "--postgres-dsn", closed_port_dsn(postgres.dsn()))
    assert code == 1 and err.startswith("toolbooth-documents: error: PostgreSQL index: OperationalError")
    assert "pw-never-shown" not in err


def test_output_json_of_index_list_and_delete(settings: IndexSettings, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plan.md").write_text("# Plan\nfirst\n")
    (tmp_path / "bad.md").write_bytes(b"# Bad \xff\n")
    code, out, err = run(capsys, "index", str(tmp_path), "--tenant", "acme", "--project", "alpha", "--output", "json")
    indexed = json.loads(out)
    plan = document_id("acme", "alpha", "plan.md")
    assert (code, err) == (1, "") and indexed["counts"] == {"added": 1, "updated": 0, "unchanged": 0}
    assert indexed["documents"] == [{"change": "added", "document_id": plan, "version": 1, "source": "plan.md",
                                     "title": "Plan", "restricted": False}]
    assert indexed["skipped"] == [{"path": str(tmp_path / "bad.md"), "reason": "not UTF-8 text (byte 6)"}]
    assert (indexed["tenant"], indexed["project"], indexed["index"]) == ("acme", "alpha", settings.describe())
    code, out, _ = run(capsys, "list", "--output", "json")
    assert code == 0 and [(d["document_id"], d["version"], d["title"]) for d in json.loads(out)] == [(plan, 1, "Plan")]
    code, out, _ = run(capsys, "delete", plan, "--output", "json")
    assert code == 0 and json.loads(out)["deleted"]["document_id"] == plan
    code, out, err = run(capsys, "delete", plan, "--output", "json")
    assert (code, out) == (1, "") and json.loads(err)["error"] == {
        "code": "FAILURE", "exit_code": 1, "message": f"there is no document {plan} in {settings.describe()}"}


def test_usage_errors_are_json_with_output_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "delete", "doc_123", "--output", "json")
    assert code == 2 and json.loads(err)["error"]["message"].endswith("'doc_123' is not a document id ('doc_' and 24 "
                                                                      "hexadecimal digits)")
    code, _, err = run(capsys, "list", "--output", "json", "--postgres-dsn", "host=x password=hunter2 bogus=1")
    assert code == 2 and json.loads(err)["error"]["code"] == "USAGE" and "hunter2" not in err


@pytest.mark.parametrize("width", [60, 40])
def test_list_fits_a_narrow_terminal(settings: IndexSettings, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    run(capsys, "index", "--sample")
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, _ = run(capsys, "list")
    rows = table_rows(out, ["DOCUMENT ID", "TENANT", "PROJECT", "VERSION", "RESTRICTED", "UPDATED AT", "TITLE"],
                      anchor=3)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= width
    assert {row[0] for row in rows} == {document_id("dev", "toolbooth", path.name)
                                        for path in sample_directory().iterdir()}
