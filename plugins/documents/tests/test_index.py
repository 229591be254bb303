"""The index on both backends: tenants, projects, restricted documents, ranking, pages, versions, failures."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from plugins.documents.tests.support import Corpus
from tests.support.postgres import PostgresServer, closed_port_dsn
from tests.support.waiting import until
from toolbooth_documents.index import Index, open_index
from toolbooth_documents.postgres_index import PostgresIndex
from toolbooth_documents.records import After, Change, IndexUnavailable, UnknownProject
from toolbooth_documents.settings import ConfigurationError, IndexSettings
from toolbooth_documents.sqlite_index import SqliteIndex
from toolbooth_documents.terms import query_words

T = 5.0  # seconds: the timeout of each operation here


async def _search(index: Index, query: str, *, tenant: str = "acme", project: str | None = None,
                  after: After | None = None, limit: int = 20) -> list[str]:
    hits = await index.search(tenant, query_words(query), project, after, limit, timeout=T)
    return [hit.title for hit in hits]


async def test_a_search_sees_only_the_callers_tenant_and_the_project_asked_for(corpus: Corpus) -> None:
    await corpus.add("acme", "alpha", {"a.md": "# Alpha plan\nthe launch plan\n"})
    await corpus.add("acme", "beta", {"b.md": "# Beta plan\nanother launch plan\n"})
    await corpus.add("globex", "alpha", {"g.md": "# Globex plan\ntheir launch plan\n"})
    assert sorted(await _search(corpus.index, "launch plan")) == ["Alpha plan", "Beta plan"]
    assert await _search(corpus.index, "launch", project="beta") == ["Beta plan"]
    assert await _search(corpus.index, "launch", tenant="globex", project="alpha") == ["Globex plan"]
    assert await _search(corpus.index, "launch", tenant="initech") == []
    with pytest.raises(UnknownProject):
        await _search(corpus.index, "launch", tenant="globex", project="beta")  # acme's project


async def test_an_empty_project_may_be_searched(corpus: Corpus) -> None:
    await corpus.index.add_project("acme", "empty")
    assert await _search(corpus.index, "anything", project="empty") == []


async def test_a_restricted_document_matches_by_title_only_and_has_no_snippet(corpus: Corpus) -> None:
    await corpus.add("acme", "alpha", {"r.md": "# Salary review\nconfidential numbers: merger with initech\n"},
                     restricted=True)
    await corpus.add("acme", "alpha", {"o.md": "# Open notes\nwe talk about the salary review in public\n"})
    hits = await corpus.index.search("acme", query_words("salary review"), None, None, 20, timeout=T)
    by_title = {hit.title: hit for hit in hits}
    assert set(by_title) == {"Salary review", "Open notes"}
    assert (by_title["Salary review"].restricted, by_title["Salary review"].snippet) == (True, "")
    assert "salary review" in by_title["Open notes"].snippet and not by_title["Open notes"].restricted
    assert await _search(corpus.index, "merger") == []  # its body is not indexed
    assert await _search(corpus.index, "confidential numbers") == []


async def test_title_matches_rank_first_and_snippets_show_the_words(corpus: Corpus) -> None:
    await corpus.add("acme", "alpha", {
        "1.md": "# Notes\n" + "filler text. " * 40 + "Somewhere the approval hash is mentioned once.\n",
        "2.md": "# Approval hash\nHow the approval binds the preview hash.\n",
    })
    hits = await corpus.index.search("acme", query_words("approval hash"), None, None, 20, timeout=T)
    assert [hit.title for hit in hits] == ["Approval hash", "Notes"]
    assert hits[0].score > hits[1].score
    assert "approval hash" in hits[1].snippet and len(hits[1].snippet) < 400


async def test_pages_after_a_position_cover_every_match_once(corpus: Corpus) -> None:
    files = {f"{n:02}.md": f"# Doc {n:02}\n" + "deploy " * (1 + n % 4) + "text\n" for n in range(11)}
    await corpus.add("acme", "alpha", files)
    words = query_words("deploy")
    everything = await corpus.index.search("acme", words, None, None, 20, timeout=T)
    seen: list[str] = []
    after = None
    while True:
        page = await corpus.index.search("acme", words, None, after, 3, timeout=T)
        seen += [hit.document_id for hit in page]
        if len(page) < 3:
            break
        after = After(page[-1].score, page[-1].document_id)
    assert seen == [hit.document_id for hit in everything] and len(seen) == 11
    assert [hit.score for hit in everything] == sorted((hit.score for hit in everything), reverse=True)
    assert await corpus.index.search("acme", words, None, None, 20, timeout=T) == everything  # stable


async def test_indexing_again_bumps_the_version_of_changed_documents_only(corpus: Corpus) -> None:
    assert await corpus.add("acme", "alpha", {"a.md": "# A\none\n", "b.md": "# B\n"}) == [
        (Change.ADDED, 1), (Change.ADDED, 1)]
    assert await corpus.add("acme", "alpha", {"a.md": "# A\ntwo\n", "b.md": "# B\n"}) == [
        (Change.UPDATED, 2), (Change.UNCHANGED, 1)]
    assert await corpus.add("acme", "alpha", {"a.md": "# A\ntwo\n"}, restricted=True) == [(Change.UPDATED, 3)]
    assert await _search(corpus.index, "one") == []
    assert await _search(corpus.index, "two") == []  # restricted now: its body left the index
    passage = await corpus.index.read("acme", corpus.ids["acme/alpha/a.md"], 0, 100, timeout=T)
    assert passage is not None and (passage.version, passage.text, passage.restricted) == (3, "# A\ntwo\n", True)


async def test_a_read_is_a_slice_of_characters_of_the_callers_document(corpus: Corpus) -> None:
    body = "# Été\n" + "naïve café ☕ " * 20
    await corpus.add("acme", "alpha", {"a.md": body})
    doc = corpus.ids["acme/alpha/a.md"]
    passage = await corpus.index.read("acme", doc, 6, 11, timeout=T)
    assert passage is not None
    assert (passage.text, passage.offset, passage.length, passage.title) == ("naïve café ", 6, len(body), "Été")
    end = await corpus.index.read("acme", doc, len(body) - 3, 100, timeout=T)
    assert end is not None and end.text == body[-3:]
    assert await corpus.index.read("globex", doc, 0, 100, timeout=T) is None
    assert await corpus.index.read("acme", "doc_" + "0" * 24, 0, 100, timeout=T) is None


async def test_delete_removes_a_document_from_search_and_read(corpus: Corpus) -> None:
    await corpus.add("acme", "alpha", {"a.md": "# Gone soon\nephemeral\n", "b.md": "# Stays\nephemeral too\n"})
    doc = corpus.ids["acme/alpha/a.md"]
    deleted = await corpus.index.delete(doc)
    assert deleted is not None and (deleted.document_id, deleted.title, deleted.tenant) == (doc, "Gone soon", "acme")
    assert await corpus.index.delete(doc) is None
    assert await corpus.index.read("acme", doc, 0, 100, timeout=T) is None
    assert await _search(corpus.index, "ephemeral") == ["Stays"]
    assert [listed.title for listed in await corpus.index.documents(None, None)] == ["Stays"]


async def test_listing_filters_by_tenant_and_project(corpus: Corpus) -> None:
    await corpus.add("acme", "alpha", {"a.md": "# A\n"})
    await corpus.add("acme", "beta", {"b.md": "# B\n"})
    await corpus.add("globex", "alpha", {"g.md": "# G\n"})
    assert [d.title for d in await corpus.index.documents(None, None)] == ["A", "B", "G"]
    assert [d.title for d in await corpus.index.documents("acme", None)] == ["A", "B"]
    assert [d.title for d in await corpus.index.documents(None, "alpha")] == ["A", "G"]


async def test_the_cursor_key_is_generated_once_and_kept_in_the_index(settings: IndexSettings) -> None:
    key = await open_index(settings).cursor_key()
    assert len(key) == 32
    again = (PostgresIndex(settings.dsn) if settings.dsn else SqliteIndex(settings.sqlite_path))
    assert await again.cursor_key() == key  # another object, another process: the same key


async def test_a_configured_cursor_key_file_is_used(settings: IndexSettings, tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(b"configured-cursor-key-0123456789\n")
    configured = settings.model_copy(update={"cursor_key_file": tmp_path / "key"})
    assert await open_index(configured).cursor_key() == b"configured-cursor-key-0123456789"


async def test_an_index_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(IndexUnavailable, match="cannot open"):
        await SqliteIndex(tmp_path / "file" / "documents.db").search("acme", ("x",), None, None, 5, timeout=T)


async def test_a_locked_sqlite_index_is_unavailable(tmp_path: Path) -> None:
    index = SqliteIndex(tmp_path / "documents.db")
    await index.add_project("acme", "alpha")
    holder = sqlite3.connect(tmp_path / "documents.db", isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")  # in WAL mode, with exclusive locking, nobody else may even read
        with pytest.raises(IndexUnavailable, match="database is locked"):
            await index.search("acme", ("x",), None, None, 5, timeout=0.05)
    finally:
        holder.close()
    assert await index.search("acme", ("x",), None, None, 5, timeout=T) == []


async def test_an_unreachable_postgres_index_is_unavailable(postgres: PostgresServer) -> None:
    with pytest.raises(IndexUnavailable, match="PostgreSQL index: OperationalError") as caught:
        await PostgresIndex(closed_port_dsn(postgres.dsn())).search("acme", ("x",), None, None, 5, timeout=T)
    assert "pw-never-shown" not in str(caught.value)


async def test_an_index_of_another_schema_version_is_refused(settings: IndexSettings) -> None:
    index = open_index(settings)
    await index.add_project("acme", "alpha")
    if settings.dsn is None:
        with sqlite3.connect(settings.sqlite_path) as conn:
            conn.execute("UPDATE toolbooth_documents_meta SET value = '9' WHERE name = 'schema_version'")
        fresh: Index = SqliteIndex(settings.sqlite_path)
    else:
        import psycopg

        with psycopg.connect(settings.dsn, autocommit=True) as conn:
            conn.execute("UPDATE toolbooth_documents_meta SET value = '9' WHERE name = 'schema_version'")
        fresh = PostgresIndex(settings.dsn)
    with pytest.raises(ConfigurationError, match="has schema version 9; this toolbooth-documents knows version 1"):
        await fresh.documents(None, None)


async def test_a_cancelled_sqlite_call_aborts_its_statement(tmp_path: Path) -> None:
    index = SqliteIndex(tmp_path / "documents.db")
    started, ended = threading.Event(), threading.Event()
    outcome: list[str] = []

    def endless(conn: sqlite3.Connection) -> None:
        started.set()
        try:
            conn.execute("WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n")
        except sqlite3.OperationalError as exc:
            outcome.append(str(exc))
            raise
        finally:
            ended.set()

    call = asyncio.create_task(index._run(endless, timeout=T))
    await until(started.is_set, what="the statement starting")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await until(ended.is_set, timeout=5, what="the interrupted statement ending")
    assert outcome == ["interrupted"]
