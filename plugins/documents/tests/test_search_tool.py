"""``search_documents`` through a real sidecar, on both backends: every "Important tests" line of the design.

Callers authenticate with JWTs of tenant ``acme`` or ``globex``; the default policies grant the tools'
permissions (``documents:search``, ``documents:read``) held directly by the token.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from plugins.documents.tests.support import Corpus, Sidecars, call, token
from sidecar.client import AsyncClient
from sidecar.contract import ErrorCode, Recovery, SideEffect, Status, ToolResult

pytestmark = pytest.mark.integration


async def search(address: str, tenant: str = "acme", **arguments: Any) -> ToolResult:
    return await call(address, "search_documents", arguments, tenant=tenant)


def titles(result: ToolResult) -> list[str]:
    assert result.status is Status.SUCCESS, result.error
    return [item["title"] for item in result.data["items"]]


def refused(result: ToolResult, code: ErrorCode, field: str | None) -> str:
    """The message of a result that is ``code`` for ``field``."""
    assert result.status is Status.ERROR and result.error is not None, result
    assert (result.error.code, result.error.field) == (code, field), result.error
    return result.error.message


async def test_both_tools_are_listed_with_their_contract(address: str) -> None:
    async with AsyncClient(address, token=token(), timeout=10) as client:
        listing = await client.list_tools()
    tools = {tool.name: tool for tool in listing.tools}
    assert set(tools) == {"search_documents", "read_document"}
    search_tool, read_tool = tools["search_documents"], tools["read_document"]
    assert (search_tool.side_effect, search_tool.requires_idempotency_key, search_tool.timeout_ms) == (
        SideEffect.NONE, False, 3000)
    assert (read_tool.side_effect, read_tool.requires_idempotency_key, read_tool.timeout_ms) == (
        SideEffect.NONE, False, 2000)
    limit = search_tool.input_schema["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"], limit["default"]) == ("integer", 1, 20, 10)
    characters = read_tool.input_schema["properties"]["max_characters"]
    assert (characters["minimum"], characters["maximum"]) == (1000, 20000)
    assert read_tool.input_schema["properties"]["document_id"]["pattern"] == "^doc_[0-9a-f]{24}$"


# --- Returns only documents from permitted projects -------------------------------


async def test_returns_only_documents_from_permitted_projects(address: str) -> None:
    assert sorted(titles(await search(address, query="launch"))) == [
        "Beta launch", "Launch budget review", "Launch plan", "Meeting notes"]
    assert titles(await search(address, query="launch", project_id="beta")) == ["Beta launch"]
    assert titles(await search(address, "globex", query="launch")) == ["Globex launch"]
    assert titles(await search(address, "globex", query="launch", project_id="alpha")) == ["Globex launch"]
    result = await search(address, "initech", query="launch")
    assert titles(result) == [] and result.data["has_more"] is False and result.data["next_cursor"] is None


async def test_a_project_of_another_organization_is_refused_like_a_missing_one(address: str) -> None:
    other_tenants = refused(await search(address, query="launch", project_id="gamma"),
                            ErrorCode.INVALID_ARGUMENT, "project_id")
    missing = refused(await search(address, query="launch", project_id="nowhere"),
                      ErrorCode.INVALID_ARGUMENT, "project_id")
    assert other_tenants == "there is no project 'gamma' in your organization"
    assert missing == "there is no project 'nowhere' in your organization"
    refused(await search(address, query="launch", project_id="../alpha"), ErrorCode.INVALID_ARGUMENT, "project_id")


async def test_the_search_permission_is_required(documents: Corpus, sidecars: Sidecars) -> None:
    address = await sidecars.start()
    result = await call(address, "search_documents", {"query": "launch"}, permissions=["documents:read"])
    assert refused(result, ErrorCode.PERMISSION_DENIED, None) == "missing permission(s): documents:search"
    assert result.error is not None and result.error.recovery is Recovery.REQUEST_PERMISSION


# --- Rejects a limit greater than 20 --------------------------------------------


@pytest.mark.parametrize("limit", [21, 100, 0, -1, 5.5, "5", True, None])
async def test_rejects_a_limit_greater_than_20_or_not_a_whole_number_from_1(address: str, limit: Any) -> None:
    refused(await search(address, query="launch", limit=limit), ErrorCode.INVALID_ARGUMENT, "limit")


async def test_a_limit_of_20_is_accepted(address: str) -> None:
    assert len(titles(await search(address, query="launch", limit=20))) == 4


@pytest.mark.parametrize(("query", "message"), [
    ("", "at least 1 character"),
    ("x" * 501, "at most 500 characters"),
    ("the and of", "the query has no words to search for"),
    ("?!", "the query has no words to search for"),
])
async def test_a_query_without_words_or_too_long_is_refused(address: str, query: str, message: str) -> None:
    assert message in refused(await search(address, query=query), ErrorCode.INVALID_ARGUMENT, "query")


async def test_a_query_of_500_characters_is_accepted(address: str) -> None:
    query = ("launch " * 71).ljust(500)
    assert len(query) == 500 and titles(await search(address, query=query)) != []


# --- Does not expose restricted-document snippets -------------------------------


async def test_does_not_expose_restricted_document_snippets(address: str) -> None:
    result = await search(address, query="budget review")
    (item,) = result.data["items"]
    assert (item["title"], item["restricted"], item["snippet"]) == ("Launch budget review", True, "")
    everything = await search(address, query="launch", limit=20)
    restricted = [item for item in everything.data["items"] if item["restricted"]]
    assert [(item["title"], item["snippet"]) for item in restricted] == [("Launch budget review", "")]
    assert all(item["snippet"] for item in everything.data["items"] if not item["restricted"])
    for text in (result.model_dump_json(), everything.model_dump_json()):
        assert "12345" not in text and "salary" not in text and "secret" not in text


async def test_the_body_of_a_restricted_document_cannot_be_probed_by_searching(address: str) -> None:
    for query in ("salary", "12345", "secret salary", "figures", "body secret"):
        assert titles(await search(address, query=query)) == []


# --- Returns a stable next cursor -----------------------------------------------


async def test_returns_a_stable_next_cursor(address: str) -> None:
    first = await search(address, query="launch", limit=2)
    again = await search(address, query="launch", limit=2)
    assert first.data == again.data
    assert first.data["has_more"] is True and first.data["next_cursor"]
    seen = titles(first)
    cursor = first.data["next_cursor"]
    pages = 1
    while cursor is not None:
        page = await search(address, query="launch", limit=2, cursor=cursor)
        assert page.data == (await search(address, query="launch", limit=2, cursor=cursor)).data
        seen += titles(page)
        cursor = page.data["next_cursor"]
        assert (cursor is not None) == page.data["has_more"]
        pages += 1
    assert pages == 2 and sorted(seen) == ["Beta launch", "Launch budget review", "Launch plan", "Meeting notes"]
    assert seen == titles(await search(address, query="launch", limit=20))


async def test_a_cursor_reads_on_with_another_limit(address: str) -> None:
    first = await search(address, query="launch", limit=1)
    rest = await search(address, query="launch", limit=20, cursor=first.data["next_cursor"])
    assert titles(first) + titles(rest) == titles(await search(address, query="launch", limit=20))
    assert rest.data["has_more"] is False and rest.data["next_cursor"] is None


@pytest.mark.parametrize(("tenant", "changes"), [
    ("acme", {"query": "launch plan"}),
    ("acme", {"project_id": "alpha"}),
    ("globex", {}),
])
async def test_a_cursor_of_another_search_scope_is_refused(address: str, tenant: str,
                                                           changes: dict[str, Any]) -> None:
    cursor = (await search(address, query="launch", limit=1)).data["next_cursor"]
    result = await search(address, tenant, **{"query": "launch", "limit": 1, "cursor": cursor, **changes})
    assert "this cursor belongs to another search" in refused(result, ErrorCode.INVALID_ARGUMENT, "cursor")


async def test_a_forged_or_foreign_cursor_is_refused(address: str, documents: Corpus) -> None:
    cursor = (await search(address, query="launch", limit=1)).data["next_cursor"]
    prefix, body, mac = cursor.split(".")
    forged = ".".join((prefix, body, mac[::-1]))
    assert "not a valid cursor" in refused(await search(address, query="launch", cursor=forged),
                                           ErrorCode.INVALID_ARGUMENT, "cursor")
    read = await call(address, "read_document", {"document_id": documents.ids["acme/alpha/long.md"],
                                                 "max_characters": 1000})
    message = refused(await search(address, query="launch", cursor=read.data["next_cursor"]),
                      ErrorCode.INVALID_ARGUMENT, "cursor")
    assert message == "this is a cursor of read_document; search_documents takes only the cursors it returned"
    assert json.loads(read.model_dump_json())["status"] == "success"
