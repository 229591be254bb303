"""``read_document`` through a real sidecar, on both backends: every "Important tests" line of the design."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from plugins.documents.tests.conftest import LONG
from plugins.documents.tests.support import Corpus, call
from sidecar.contract import ErrorCode, Recovery, Status, ToolResult
from toolbooth_documents import READ_RESTRICTED
from toolbooth_documents.cli import main

pytestmark = pytest.mark.integration

MISSING = "doc_" + "0" * 24


async def read(address: str, document_id: str, tenant: str = "acme", permissions: tuple[str, ...] | None = None,
               **arguments: Any) -> ToolResult:
    extra = {} if permissions is None else {"permissions": permissions}
    return await call(address, "read_document", {"document_id": document_id, **arguments}, tenant=tenant, **extra)


def refused(result: ToolResult, code: ErrorCode, field: str | None) -> str:
    assert result.status is Status.ERROR and result.error is not None, result
    assert (result.error.code, result.error.field) == (code, field), result.error
    return result.error.message


async def test_reads_a_document_of_the_callers_tenant(address: str, documents: Corpus) -> None:
    doc = documents.ids["acme/alpha/plan.md"]
    result = await read(address, doc)
    assert result.status is Status.SUCCESS and result.meta.attempt == 1
    assert result.data == {"document_id": doc, "project_id": "alpha", "title": "Launch plan",
                           "content": "# Launch plan\nThe launch of the sidecar is planned for May.\n",
                           "truncated": False, "next_cursor": None, "updated_at": result.data["updated_at"]}
    assert result.data["updated_at"].endswith("Z")


# --- Returns NOT_FOUND for inaccessible cross-tenant documents ------------------


async def test_returns_not_found_for_inaccessible_cross_tenant_documents(address: str, documents: Corpus) -> None:
    acme_doc = documents.ids["acme/alpha/plan.md"]
    cross_tenant = await read(address, acme_doc, "globex")
    message = refused(cross_tenant, ErrorCode.RESOURCE_NOT_FOUND, "document_id")
    assert message == f"there is no document {acme_doc}"
    missing = refused(await read(address, MISSING, "globex"), ErrorCode.RESOURCE_NOT_FOUND, "document_id")
    assert missing == message.replace(acme_doc, MISSING)  # the same answer: existence is not revealed
    assert "acme" not in cross_tenant.model_dump_json() and "Launch" not in cross_tenant.model_dump_json()
    assert cross_tenant.error is not None and cross_tenant.error.retryable is False
    globex_doc = documents.ids["globex/alpha/globex.md"]
    refused(await read(address, globex_doc), ErrorCode.RESOURCE_NOT_FOUND, "document_id")
    assert (await read(address, globex_doc, "globex")).status is Status.SUCCESS


async def test_a_restricted_document_needs_the_read_restricted_permission(address: str, documents: Corpus) -> None:
    doc = documents.ids["acme/alpha/budget.md"]
    denied = await read(address, doc)
    message = refused(denied, ErrorCode.PERMISSION_DENIED, None)
    assert message == f"document {doc} is restricted: reading it needs the permission documents:read_restricted"
    assert denied.error is not None and denied.error.recovery is Recovery.REQUEST_PERMISSION
    assert "12345" not in denied.model_dump_json()
    allowed = await read(address, doc, permissions=("documents:read", READ_RESTRICTED))
    assert allowed.status is Status.SUCCESS and "12345" in allowed.data["content"]
    refused(await read(address, doc, "globex", permissions=("documents:read", READ_RESTRICTED)),
            ErrorCode.RESOURCE_NOT_FOUND, "document_id")


async def test_the_read_permission_is_required(address: str, documents: Corpus) -> None:
    result = await read(address, documents.ids["acme/alpha/plan.md"], permissions=("documents:search",))
    assert refused(result, ErrorCode.PERMISSION_DENIED, None) == "missing permission(s): documents:read"


@pytest.mark.parametrize("document_id", ["doc_123", "DOC_" + "a" * 24, "doc_" + "A" * 24, "doc_" + "a" * 25,
                                         "../../etc/passwd", "", "doc_101"])
async def test_a_document_id_of_another_format_is_refused(address: str, document_id: str) -> None:
    message = refused(await read(address, document_id), ErrorCode.INVALID_ARGUMENT, "document_id")
    assert "use a document_id returned by search_documents" in message


@pytest.mark.parametrize("max_characters", [999, 20_001, 0, 5000.0, "5000", True])
async def test_max_characters_is_a_whole_number_from_1000_to_20000(address: str, documents: Corpus,
                                                                     max_characters: Any) -> None:
    result = await read(address, documents.ids["acme/alpha/long.md"], max_characters=max_characters)
    refused(result, ErrorCode.INVALID_ARGUMENT, "max_characters")


# --- Indicates when content is truncated ----------------------------------------


@pytest.mark.parametrize("max_characters", [1000, 4321, 20_000])
async def test_indicates_when_content_is_truncated(address: str, documents: Corpus, max_characters: int) -> None:
    doc = documents.ids["acme/alpha/long.md"]
    parts: list[str] = []
    cursor = None
    while True:
        result = await read(address, doc, max_characters=max_characters, **({"cursor": cursor} if cursor else {}))
        assert result.status is Status.SUCCESS, result.error
        content = result.data["content"]
        assert 0 < len(content) <= max_characters
        parts.append(content)
        cursor = result.data["next_cursor"]
        assert result.data["truncated"] is (cursor is not None)
        if cursor is None:
            break
        assert content.endswith((" ", "\n"))  # cut after a break, not within a word
    assert "".join(parts) == LONG  # nothing lost, nothing repeated
    assert (len(parts) > 1) is (len(LONG) > max_characters)


async def test_the_same_part_gives_the_same_cursor(address: str, documents: Corpus) -> None:
    doc = documents.ids["acme/alpha/long.md"]
    first = await read(address, doc, max_characters=1000)
    assert first.data == (await read(address, doc, max_characters=1000)).data


# --- Rejects a cursor created for another document ------------------------------


async def test_rejects_a_cursor_created_for_another_document(address: str, documents: Corpus) -> None:
    long_doc, plan = documents.ids["acme/alpha/long.md"], documents.ids["acme/alpha/plan.md"]
    cursor = (await read(address, long_doc, max_characters=1000)).data["next_cursor"]
    message = refused(await read(address, plan, cursor=cursor), ErrorCode.INVALID_ARGUMENT, "cursor")
    assert message.startswith(f"this cursor belongs to document {long_doc}, not {plan}")
    search = await call(address, "search_documents", {"query": "launch", "limit": 1})
    message = refused(await read(address, plan, cursor=search.data["next_cursor"]), ErrorCode.INVALID_ARGUMENT,
                      "cursor")
    assert message == "this is a cursor of search_documents; read_document takes only the cursors it returned"


async def test_rejects_a_cursor_of_an_older_version(address: str, documents: Corpus) -> None:
    doc = documents.ids["acme/alpha/long.md"]
    cursor = (await read(address, doc, max_characters=1000)).data["next_cursor"]
    assert await documents.add("acme", "alpha", {"long.md": LONG.replace("Paragraph 0", "Paragraph zero")})
    message = refused(await read(address, doc, cursor=cursor), ErrorCode.INVALID_ARGUMENT, "cursor")
    assert message == f"document {doc} has changed since this cursor was returned: read it again from the start, " \
                      "without a cursor"
    fresh = await read(address, doc, max_characters=1000)
    assert fresh.data["content"].startswith("# Long read\n\nParagraph zero")


async def test_a_forged_read_cursor_is_refused(address: str, documents: Corpus) -> None:
    doc = documents.ids["acme/alpha/long.md"]
    prefix, body, mac = (await read(address, doc, max_characters=1000)).data["next_cursor"].split(".")
    message = refused(await read(address, doc, cursor=f"{prefix}.{body}.{'A' * len(mac)}"),
                      ErrorCode.INVALID_ARGUMENT, "cursor")
    assert message.startswith("not a valid cursor")


# --- Handles a document deleted between search and read -------------------------


async def test_handles_a_document_deleted_between_search_and_read(address: str, documents: Corpus,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    found = await call(address, "search_documents", {"query": "launch plan"})
    (item,) = [item for item in found.data["items"] if item["title"] == "Launch plan"]
    assert await asyncio.to_thread(main, ["delete", item["document_id"]]) == 0
    assert capsys.readouterr().out.startswith(f"deleted {item['document_id']} v1 (tenant acme, project alpha)")
    result = await read(address, item["document_id"])
    assert refused(result, ErrorCode.RESOURCE_NOT_FOUND, "document_id") == f"there is no document {item['document_id']}"
    assert "Launch plan" not in [i["title"] for i in (await call(address, "search_documents",
                                                                 {"query": "launch plan"})).data["items"]]


async def test_a_document_deleted_while_being_read_is_not_found(address: str, documents: Corpus) -> None:
    doc = documents.ids["acme/alpha/long.md"]
    cursor = (await read(address, doc, max_characters=1000)).data["next_cursor"]
    assert await documents.index.delete(doc) is not None
    refused(await read(address, doc, cursor=cursor), ErrorCode.RESOURCE_NOT_FOUND, "document_id")
