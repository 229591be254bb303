"""Unit tests of the cursors and of the query words: signed, bound, stable; plain words only."""

from __future__ import annotations

import base64
import json

import pytest

from toolbooth_documents.cursors import MAX_CURSOR_CHARS, CursorError, Cursors, SearchScope
from toolbooth_documents.records import After
from toolbooth_documents.terms import STOP_WORDS, fts5_query, query_words

KEY = b"k" * 32
SCOPE = SearchScope(tenant="acme", query="approval hash", project_id="alpha")
AFTER = After(score=1.987297, document_id="doc_" + "a" * 24)
DOC = "doc_" + "b" * 24


def _payload(cursor: str) -> list[object]:
    body = cursor.split(".")[1]
    decoded: list[object] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return decoded


def _forged(cursor: str, payload: list[object]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).rstrip(b"=").decode()
    prefix, _, mac = cursor.split(".")
    return ".".join((prefix, body, mac))


def test_a_search_cursor_gives_back_its_position_and_is_stable() -> None:
    cursors = Cursors(KEY)
    cursor = cursors.search(SCOPE, AFTER)
    assert cursors.open_search(cursor, SCOPE) == AFTER
    assert cursors.search(SCOPE, AFTER) == cursor  # the same page of the same search: the same cursor
    assert Cursors(KEY).search(SearchScope("acme", "approval hash", "alpha"), AFTER) == cursor
    assert len(cursor) <= MAX_CURSOR_CHARS and cursor.startswith("v1.")


def test_a_search_cursor_does_not_show_the_scope() -> None:
    cursor = Cursors(KEY).search(SCOPE, AFTER)
    assert not any(word in cursor for word in ("acme", "approval", "alpha"))
    assert "acme" not in str(_payload(cursor))


@pytest.mark.parametrize("other", [
    SearchScope("globex", "approval hash", "alpha"),  # another tenant
    SearchScope("acme", "approval  hash", "alpha"),  # another query
    SearchScope("acme", "approval hash", None),  # all projects instead of one
    SearchScope("acme", "approval hash", "beta"),  # another project
])
def test_a_search_cursor_belongs_to_its_scope(other: SearchScope) -> None:
    cursors = Cursors(KEY)
    with pytest.raises(CursorError, match="belongs to another search"):
        cursors.open_search(cursors.search(SCOPE, AFTER), other)


def test_a_cursor_of_another_key_or_tampered_is_not_valid() -> None:
    cursor = Cursors(KEY).search(SCOPE, AFTER)
    with pytest.raises(CursorError, match="not a valid cursor"):
        Cursors(b"o" * 32).open_search(cursor, SCOPE)
    payload = _payload(cursor)
    payload[2] = 99.0  # jump ahead
    with pytest.raises(CursorError, match="not a valid cursor"):
        Cursors(KEY).open_search(_forged(cursor, payload), SCOPE)


@pytest.mark.parametrize("text", ["", "x", "v1", "v1..", "v2.e30.AAAA", "v1.e30.AAAA", "v1.!!!.AAAA",
                                  "v1.e30.AAAA.AAAA", "cursor_abc", "v1.WyJzIl0.=="])
def test_malformed_cursors_are_not_valid(text: str) -> None:
    with pytest.raises(CursorError, match="not a valid cursor: pass next_cursor exactly as it was returned"):
        Cursors(KEY).open_search(text, SCOPE)


def test_a_read_cursor_gives_back_version_and_offset() -> None:
    cursors = Cursors(KEY)
    cursor = cursors.read(DOC, 3, 4500)
    assert cursors.open_read(cursor, DOC) == (3, 4500)
    assert cursors.read(DOC, 3, 4500) == cursor


def test_a_read_cursor_belongs_to_its_document() -> None:
    cursors = Cursors(KEY)
    other = "doc_" + "c" * 24
    with pytest.raises(CursorError, match=f"belongs to document {DOC}, not {other}"):
        cursors.open_read(cursors.read(DOC, 1, 1000), other)


def test_cursors_of_one_tool_are_refused_by_the_other() -> None:
    cursors = Cursors(KEY)
    with pytest.raises(CursorError, match="cursor of read_document; search_documents takes only"):
        cursors.open_search(cursors.read(DOC, 1, 1000), SCOPE)
    with pytest.raises(CursorError, match="cursor of search_documents; read_document takes only"):
        cursors.open_read(cursors.search(SCOPE, AFTER), DOC)


# --- query words ------------------------------------------------------------------


def test_query_words_are_plain_lower_case_words_without_stop_words() -> None:
    assert query_words("How does the Sidecar handle APPROVALS?") == ("sidecar", "handle", "approvals")
    assert query_words("create_task, send-email: 2 times") == ("create", "task", "send", "email", "2", "times")
    assert query_words("hash hash HASH") == ("hash",)
    assert query_words("the of and") == ()
    assert query_words("?! -- ..") == ()


def test_query_syntax_of_the_backends_is_only_words() -> None:
    # FTS5 column filters and operators, tsquery operators: all become words or separators
    assert query_words('body:secret OR title:"x" NEAR(a b) !x & y | z*') == (
        "body", "secret", "title", "x", "near", "b", "y", "z")
    assert fts5_query(("body", "secret")) == '"body" AND "secret"'


def test_stop_words_are_postgresqls_english_list() -> None:
    assert len(STOP_WORDS) == 127
    assert {"the", "and", "not", "very", "s", "t", "don"} <= STOP_WORDS
