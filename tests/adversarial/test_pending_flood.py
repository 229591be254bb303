"""A flood of pending previews hides no one's approvals (issue 23, item 4), on both stores.

A real sidecar on TCP (JWT) with its approval inbox: another tenant's previews, newer and more than a page,
no longer push an approver's own tenant's preview out of ``ListPreviews`` or the inbox (the store filters by
tenant before the approver rule); every preview is listed exactly once, page after page, newest first, also
among previews created at the same instant; a page token holds a place only (another caller's token shows
them nothing more), and a forged one is INVALID_ARGUMENT; a principal holding
``limits.max_pending_previews_per_principal`` pending previews gets ``RATE_LIMITED`` for the next call that
needs approval, even when its calls come at once, while everyone else's calls are still held. ``toolbooth
previews list`` and ``approve`` follow the pages.
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.bootstrap import assemble
from sidecar.cli import main
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Limits, Settings
from sidecar.contract import ErrorCode, Preview, Recovery, Status
from sidecar.pipeline.preview_pages import BAD_PAGE_TOKEN
from sidecar.server import create_server
from sidecar.server.approvals_ui import ApprovalsInbox
from sidecar.state import PreviewRecord, Store
from sidecar.state.rows import preview_row
from sidecar.state.statements import StoreStatements
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.integration.conftest import jwt_auth, make_settings, make_token, rsa_key, socket_path
from tests.support import tools
from tests.support.approvals import NOTE, policies
from tests.support.inbox import Browser
from tests.support.stores import BACKENDS, open_store

__all__ = ["jwt_auth", "make_settings", "make_token", "postgres", "postgres_dsn", "rsa_key", "socket_path"]

pytestmark = pytest.mark.integration
CAP = 12  # limits.max_pending_previews_per_principal of these sidecars
FLOOD = 1001  # another tenant's previews, newer than the approver's: more than ListPreviews' largest page


@dataclass
class World:
    """One JWT sidecar over a store, with its inbox; acme's alice asks, bob approves; evil's mallory floods."""

    target: str
    inbox_url: str
    tokens: Callable[..., str]
    store: Store
    clients: list[AsyncClient] = field(default_factory=list)
    browsers: list[Browser] = field(default_factory=list)

    def client(self, sub: str, roles: tuple[str, ...] = ("developer",), tenant: str = "acme") -> AsyncClient:
        token = self.tokens(sub=sub, roles=list(roles), tenant=tenant)
        self.clients.append(client := AsyncClient(self.target, token=token))
        return client

    async def held(self, client: AsyncClient, key: str) -> Preview:
        result = await client.execute("file_note", NOTE, idempotency_key=key)
        assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
        return result.preview

    async def signed_in(self, sub: str = "bob") -> Browser:
        self.browsers.append(browser := Browser(self.inbox_url))
        page = await browser.sign_in(self.tokens(sub=sub, roles=["approver"]))
        assert (page.status, page.location) == (303, "/inbox"), page.text
        return browser

    async def seed(self, tenant: str, principal_id: str, count: int, *, created_at: float | None = None) -> list[str]:
        """``count`` pending previews of ``principal_id`` stored at once, newest last (or all at ``created_at``)."""
        now = time.time()
        records = [PreviewRecord(
            preview_id=secrets.token_hex(24), preview_hash="sha256:" + "0" * 64, tenant=tenant,
            principal_id=principal_id, tool="file_note", tool_version="1.0.0", call_json="{}", policy_revision="r",
            reason="seeded", approver_roles=("approver",), expires_at=now + 600,
            created_at=now + n / 1000 if created_at is None else created_at) for n in range(count)]
        driver = self.store.driver  # type: ignore[attr-defined]
        async with driver.transaction(lock=None) as tx:
            await tx.execute_many(StoreStatements.of(driver.dialect).insert_preview, [preview_row(r) for r in records])
        return [r.preview_id for r in records]


@pytest.fixture(params=BACKENDS, ids=str)
async def world(request: pytest.FixtureRequest, tmp_path: Path, make_settings: Callable[..., Settings],
                jwt_auth: dict[str, Any], make_token: Callable[..., str]) -> AsyncIterator[World]:
    store = await open_store(request, tmp_path)
    settings = make_settings(auth=jwt_auth, approvals_ui={"listen": "127.0.0.1:0", "page_size": 5})
    pipeline = assemble(registry=Registry.from_tools(tools.ALL), policy=policies(tmp_path / "policies"), store=store,
                        limits=Limits(max_pending_previews_per_principal=CAP))
    inbox = ApprovalsInbox.open(settings, pipeline.approvals)
    _, sidecar = await create_server(settings, pipeline, approvals=pipeline.approvals)
    await sidecar.start()
    await inbox.start()
    made = World(sidecar.addresses[-1], inbox.url, make_token, store)
    try:
        yield made
    finally:
        await asyncio.gather(*(c.close() for c in made.clients), *(b.close() for b in made.browsers))
        await inbox.stop()
        await sidecar.stop(None)
        await pipeline.aclose()


async def every_page(client: AsyncClient, limit: int, page_token: str = "") -> list[list[Preview]]:
    pages = []
    while True:
        page, page_token = await client.previews_page(limit=limit, page_token=page_token)
        pages.append(page)
        if not page_token:
            return pages


async def test_another_tenants_flood_hides_nothing_from_the_approver(world: World) -> None:
    mine = await world.held(world.client("alice"), "k-mine")
    flood = await world.seed("evil", "mallory", FLOOD)  # newer than alice's, and more than a page
    listed = await world.client("bob", ("approver",)).previews(limit=1000)
    assert [p.preview_id for p in listed] == [mine.preview_id]
    bob = await world.signed_in()
    inbox = await bob.get("/inbox")
    assert inbox.status == 200 and f'href="/previews/{mine.preview_id}"' in inbox.text, inbox.text
    assert "1 pending" in inbox.text and not any(f"/previews/{p}" in inbox.text for p in flood[-10:])
    operator = await every_page(world.client("olga", ("operator",)), 1000)
    assert [len(page) for page in operator] == [1000, FLOOD + 1 - 1000]
    assert [p.preview_id for page in operator for p in page] == [*reversed(flood), mine.preview_id]


def _token_of(place_json: str) -> str:
    return "p1." + base64.urlsafe_b64encode(place_json.encode()).decode().rstrip("=")


# Well-formed tokens of places no listing reads: an id no preview can have (a lone surrogate the store cannot
# even encode, a NUL, a quote), a time before the epoch.
STRANGE_PLACES = tuple(_token_of(place) for place in (
    '[9e9,"\\ud800"]', '[9e9,"a\\u0000b"]', "[9e9,\"' OR 1=1 --\"]", '[-1,"abc"]'))


async def test_pages_list_every_preview_once_newest_first(world: World) -> None:
    now = time.time()
    older = await world.seed("acme", "carol", 7, created_at=now - 5)  # seven created at the same instant
    newer = await world.seed("acme", "carol", 9)
    await world.seed("evil", "mallory", 20)
    bob = world.client("bob", ("approver",))
    pages = await every_page(bob, 4)
    assert [len(page) for page in pages] == [4, 4, 4, 4]
    listed = [p.preview_id for page in pages for p in page]
    assert listed[:9] == list(reversed(newer)) and sorted(listed[9:]) == sorted(older)
    assert listed[9:] == sorted(older, reverse=True)  # ties: by id, descending, across page boundaries
    # an operator's token, deep inside the other tenant's previews, holds a place and nothing more for bob
    _, operators_token = await world.client("olga", ("operator",)).previews_page(limit=3)
    rest = [p.preview_id for page in await every_page(bob, 100, operators_token) for p in page]
    assert rest == listed
    for forged in ("p1.bm90IGEgdG9rZW4", "p1." + "A" * 500, "not-a-token", "p1.WzEsIDJd", *STRANGE_PLACES):
        with pytest.raises(ClientError) as refused:
            await bob.previews_page(page_token=forged)
        assert (refused.value.code, refused.value.details) == (grpc.StatusCode.INVALID_ARGUMENT, BAD_PAGE_TOKEN)


async def test_the_inbox_pages_with_older_links_through_everything(world: World) -> None:
    bob = await world.signed_in()
    for forged in STRANGE_PLACES:  # no 500: the newest page
        refused = await bob.get(f"/inbox?after={forged}")
        assert refused.status in (200, 303), refused.text
    mine = [await world.held(world.client("alice"), f"k-{n}") for n in range(3)]
    seeded = await world.seed("acme", "carol", 8)
    await world.seed("evil", "mallory", 30)
    bob, seen, path = await world.signed_in(), list[str](), "/inbox"
    for _ in range(10):
        page = await bob.get(path)
        assert page.status == 200, page.text
        seen += re.findall(r'<li class="card preview" id="preview-([^"]+)"', page.text)
        older = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        if older is None:
            break
        path = html.unescape(older[1])
    assert seen == [*reversed(seeded), *(p.preview_id for p in reversed(mine))]


async def test_past_the_cap_a_call_needing_approval_is_rate_limited(world: World) -> None:
    mallory = world.client("mallory", tenant="evil")
    results = await asyncio.gather(*(mallory.execute("file_note", NOTE, idempotency_key=f"m-{n}")
                                     for n in range(CAP + 8)))  # at once: the cap is counted under a lock
    outcomes = Counter(r.error.code if r.error else r.status for r in results)
    assert outcomes == {ErrorCode.APPROVAL_REQUIRED: CAP, ErrorCode.RATE_LIMITED: 8}, outcomes
    refused = next(r for r in results if r.error is not None and r.error.code is ErrorCode.RATE_LIMITED)
    assert refused.preview is None and refused.error is not None
    assert refused.error.retryable and refused.error.recovery is Recovery.RETRY_WITH_BACKOFF
    assert "Wait until an approver has decided some of them" in refused.error.message
    await world.held(world.client("alice"), "k-still")  # everyone else's calls are still held
    await world.held(world.client("trent", tenant="evil"), "t-still")  # in the flooder's tenant too
    operator = world.client("olga", ("operator",))
    [first, *_] = [p for p in await operator.previews(limit=1000) if '"mallory"' in p.call_json]
    denied = await world.client("victor", ("approver",), tenant="evil").deny(first.preview_id, reason="no")
    assert denied.ok
    await world.held(mallory, "m-after")  # a decided one makes room


async def test_the_cli_follows_the_pages(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    mine = await world.held(world.client("alice"), "k-mine")  # the oldest: past the first page
    seeded = await world.seed("acme", "carol", 1500)
    await world.seed("evil", "mallory", 50)
    bob = ["--target", world.target, "--token", world.tokens(sub="bob", roles=["approver"]), "--output", "json"]

    async def toolbooth(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(main, [*argv, *bob])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = await toolbooth("previews", "list", "--limit", "1200")  # two pages
    cut_short = [p["preview_id"] for p in json.loads(out)]
    assert code == 0 and cut_short == list(reversed(seeded))[:1200]
    token = err.rpartition("--page-token ")[2].strip()
    assert err == f"more previews are pending: list them with --page-token {token}\n"
    code, out, _ = await toolbooth("previews", "list", "--page-token", token)
    assert code == 0 and [p["preview_id"] for p in json.loads(out)] == [*list(reversed(seeded))[1200:],
                                                                       mine.preview_id]
    code, out, _ = await toolbooth("approve", mine.preview_id)  # without --hash: found on the pages
    assert code == 0 and json.loads(out)["preview"]["state"] == "approved"
