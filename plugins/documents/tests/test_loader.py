"""Unit tests of the loader: titles, front matter, ids, dates, what is skipped and why."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from toolbooth_documents.loader import MAX_FILE_BYTES, load_directory, load_file
from toolbooth_documents.records import Document, document_id


def _write(root: Path, name: str, text: str | bytes) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _load(root: Path, name: str, text: str | bytes, **options: bool) -> Document:
    return load_file(_write(root, name, text), root, tenant="acme", project_id="alpha", **options)


@pytest.mark.parametrize(("name", "text", "title"), [
    ("a.md", "intro\n\n## Second level first\n\n# Top\n", "Second level first"),
    ("b.md", "# Closed heading ##\n", "Closed heading"),
    ("c.md", "Setext title\n============\n\nbody\n", "Setext title"),
    ("d.md", "```\n# not a heading\n```\n\n# Real one\n", "Real one"),
    ("e.md", "no heading at all\n", "e"),
    ("release-notes_2026.md", "plain text\n", "release notes 2026"),
    ("f.txt", "# a txt file has no headings\n", "f"),
    ("g.md", "---\ntitle: From front matter\n---\n# Heading\n", "From front matter"),
])
def test_the_title_is_the_front_matters_the_first_heading_or_the_file_name(
        tmp_path: Path, name: str, text: str, title: str) -> None:
    assert _load(tmp_path, name, text).title == title


def test_front_matter_is_not_part_of_the_body_and_sets_the_date_and_restriction(tmp_path: Path) -> None:
    doc = _load(tmp_path, "a.md", "---\nupdated_at: 2026-07-18T14:30:00+02:00\nrestricted: true\ntags: [x]\n---\n"
                                  "# Title\nbody\n")
    assert doc.body == "# Title\nbody\n"
    assert doc.updated_at == datetime(2026, 7, 18, 12, 30, tzinfo=UTC)
    assert doc.restricted is True
    assert _load(tmp_path, "b.md", "---\nupdated_at: 2026-07-18\n---\nx").updated_at == datetime(2026, 7, 18,
                                                                                              tzinfo=UTC)
    assert _load(tmp_path, "c.md", "---\nupdated_at: '2026-07-18 08:00'\n---\nx").updated_at == datetime(
        2026, 7, 18, 8, tzinfo=UTC)


def test_without_front_matter_the_date_is_the_modification_time(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.md", "# A\n")
    os.utime(path, (1_700_000_000.7, 1_700_000_000.7))
    doc = load_file(path, tmp_path, tenant="acme", project_id="alpha")
    assert doc.updated_at == datetime.fromtimestamp(1_700_000_000, UTC)
    assert doc.restricted is False


def test_restricted_applies_to_every_file_and_front_matter_cannot_lift_it(tmp_path: Path) -> None:
    assert _load(tmp_path, "a.md", "x", restricted=True).restricted is True
    assert _load(tmp_path, "b.md", "---\nrestricted: false\n---\nx", restricted=True).restricted is True


def test_the_id_is_stable_and_depends_on_tenant_project_and_path(tmp_path: Path) -> None:
    doc = _load(tmp_path, "sub/a.md", "# A\n")
    assert doc.source == "sub/a.md"
    assert doc.document_id == document_id("acme", "alpha", "sub/a.md")
    assert _load(tmp_path, "sub/a.md", "# changed\n").document_id == doc.document_id
    assert len({doc.document_id, document_id("globex", "alpha", "sub/a.md"), document_id("acme", "beta", "sub/a.md"),
                document_id("acme", "alpha", "a.md")}) == 4
    assert doc.document_id.startswith("doc_") and len(doc.document_id) == 28


@pytest.mark.parametrize(("text", "reason"), [
    (b"\xff\xfe not utf-8", "not UTF-8 text (byte 0)"),
    ("---\ntitle: [unclosed\n---\nx", "front matter is not valid YAML"),
    ("---\n- a list\n---\nx", "front matter must be a mapping"),
    ("---\nrestricted: yes please\n---\nx", "front matter 'restricted' must be true or false"),
    ("---\ntitle: 42\n---\nx", "front matter 'title' must be non-empty text"),
    ("---\nupdated_at: last week\n---\nx", "front matter 'updated_at' is not an ISO 8601 date or time"),
])
def test_an_unusable_file_is_skipped_with_its_reason_and_the_others_load(
        tmp_path: Path, text: str | bytes, reason: str) -> None:
    _write(tmp_path, "bad.md", text)
    _write(tmp_path, "good.md", "# Good\n")
    documents, skipped = load_directory(tmp_path, tenant="acme", project_id="alpha")
    assert [doc.title for doc in documents] == ["Good"]
    assert [s.path.name for s in skipped] == ["bad.md"] and reason in skipped[0].reason


def test_a_file_too_large_is_skipped(tmp_path: Path) -> None:
    _write(tmp_path, "big.md", "x" * (MAX_FILE_BYTES + 1))
    documents, skipped = load_directory(tmp_path, tenant="acme", project_id="alpha")
    assert documents == [] and skipped[0].reason == "larger than 2 MiB"


def test_only_markdown_and_text_files_outside_hidden_directories_are_loaded(tmp_path: Path) -> None:
    for name in ("a.md", "b.markdown", "c.txt", "D.MD", "e.py", "f.html", ".hidden.md", ".git/g.md", "sub/h.md"):
        _write(tmp_path, name, "text\n")
    documents, skipped = load_directory(tmp_path, tenant="acme", project_id="alpha")
    assert [doc.source for doc in documents] == ["D.MD", "a.md", "b.markdown", "c.txt", "sub/h.md"]
    assert skipped == []


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path: Path) -> None:
    doc = _load(tmp_path, "a.md", "\ufeff# Title\n")
    assert (doc.title, doc.body) == ("Title", "# Title\n")
