"""A real sidecar with its approval inbox, and a browser-like HTTP client of it.

``async with served_inbox(settings, tokens, root) as world`` serves ``file_note`` (held by the test
policies, its ``/body`` masked) and the contract tools' ``send_email_preview``/``send_email`` (rendered)
over gRPC and the inbox of ``settings.approvals_ui``. ``Browser(url)`` talks to the inbox over aiohttp,
keeps its cookies and follows no redirects; every answer is a ``Page`` with its status, headers, text
and the cookies it set (as ``http.cookies.Morsel``s, for their flags).
"""

from __future__ import annotations

import asyncio
import html
import re
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.cookies import Morsel, SimpleCookie
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from sidecar.bootstrap import assemble
from sidecar.client import AsyncClient
from sidecar.config import Limits, Settings
from sidecar.contract import Preview, Status
from sidecar.server import create_server
from sidecar.server.approvals_ui import ApprovalsInbox
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.support import contract_tools, tools
from tests.support.approvals import NOTE, policies

__all__ = ["MAIL", "Browser", "Page", "World", "free_port", "served_inbox"]

Tokens = Callable[..., str]
MAIL = {"recipients": [{"email": "ana@example.com"}], "cc": [], "subject": "Deployment complete",
        "body_text": "The new version has been deployed.\nRollback plan attached."}

_INPUT = re.compile(r'<input type="hidden" name="(?P<name>[^"]+)" value="(?P<value>[^"]*)">')


@dataclass(frozen=True)
class Page:
    status: int
    headers: CIMultiDictProxy[str]
    text: str
    set_cookies: Mapping[str, Morsel[str]]

    def hidden(self, name: str) -> str:
        """The value of the (first) hidden form field ``name``."""
        for found in _INPUT.finditer(self.text):
            if found["name"] == name:
                return html.unescape(found["value"])
        raise AssertionError(f"no hidden field {name!r} in the page:\n{self.text}")

    @property
    def location(self) -> str | None:
        return self.headers.get("Location")


class Browser:
    """One person's browser: its own cookies, sent back to the inbox at ``url``."""

    def __init__(self, url: str) -> None:
        self.url, self.cookies = url, dict[str, str]()
        self._http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())

    async def get(self, path: str, *, headers: Mapping[str, str] | None = None) -> Page:
        return await self._send("GET", path, None, headers)

    async def post(self, path: str, fields: Mapping[str, str], *, headers: Mapping[str, str] | None = None) -> Page:
        return await self._send("POST", path, dict(fields), headers)

    async def post_raw(self, path: str, body: bytes) -> Page:
        """POST ``body`` as it is, as a URL-encoded form (one a browser would not send)."""
        return await self._send("POST", path, body, {"Content-Type": "application/x-www-form-urlencoded"})

    async def sign_in(self, token: str | None = None) -> Page:
        """Open the sign-in page and send it with ``token`` (dev mode: none)."""
        form = await self.get("/sign-in")
        fields = {"csrf": form.hidden("csrf")} | ({} if token is None else {"token": token})
        return await self.post("/sign-in", fields)

    async def close(self) -> None:
        await self._http.close()

    async def _send(self, method: str, path: str, fields: dict[str, str] | bytes | None,
                    headers: Mapping[str, str] | None) -> Page:
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        async with self._http.request(method, self.url + path, data=fields, headers=sent,
                                      allow_redirects=False) as response:
            text = await response.text()
            cookies = SimpleCookie()
            for header in response.headers.getall("Set-Cookie", []):
                cookies.load(header)
            for name, morsel in cookies.items():
                if morsel["max-age"] == "0" or not morsel.value or morsel.value == '""':
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
            return Page(response.status, response.headers, text, dict(cookies))


@dataclass
class World:
    """A running sidecar with its inbox: gRPC clients and browsers of any principal."""

    inbox: ApprovalsInbox
    target: str
    tokens: Tokens
    store: SqliteStore
    clients: list[AsyncClient] = field(default_factory=list)
    browsers: list[Browser] = field(default_factory=list)

    def client(self, sub: str = "alice", roles: tuple[str, ...] = ("developer",)) -> AsyncClient:
        self.clients.append(client := AsyncClient(self.target, token=self.tokens(sub=sub, roles=list(roles))))
        return client

    def browser(self) -> Browser:
        self.browsers.append(browser := Browser(self.inbox.url))
        return browser

    async def signed_in(self, sub: str = "bob", roles: tuple[str, ...] = ("approver",)) -> Browser:
        browser = self.browser()
        page = await browser.sign_in(self.tokens(sub=sub, roles=list(roles)))
        assert (page.status, page.location) == (303, "/inbox"), page.text
        return browser

    async def held_note(self, key: str = "k-1") -> Preview:
        result = await self.client().execute("file_note", NOTE, idempotency_key=key)
        assert result.status is Status.APPROVAL_REQUIRED and result.preview is not None, result
        return result.preview

    async def pending(self) -> list[Preview]:
        return await self.client("bob", ("approver",)).previews()


@asynccontextmanager
async def served_inbox(settings: Settings, tokens: Tokens, root: Path, **approval: Any) -> AsyncIterator[World]:
    """A started sidecar and inbox (store and policies under ``root``, ``approval`` merged into the policies'
    approval data), stopped when the block ends."""
    store = await SqliteStore.open(root / "store.db")
    registry = Registry.from_tools([tools.file_note, contract_tools.send_email_preview, contract_tools.send_email])
    pipeline = assemble(registry=registry, policy=policies(root / "policies", mask=["/body"], **approval), store=store,
                        limits=Limits())
    try:
        inbox = ApprovalsInbox.open(settings, pipeline.approvals)
        _, sidecar = await create_server(settings, pipeline, approvals=pipeline.approvals)
        await sidecar.start()
        await inbox.start()
        world = World(inbox, sidecar.addresses[-1], tokens, store)
        try:
            yield world
        finally:
            await asyncio.gather(*(c.close() for c in world.clients), *(b.close() for b in world.browsers))
            await inbox.stop()
            await sidecar.stop(None)
    finally:
        await pipeline.aclose()


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now (for an inbox whose URL must be known before it listens)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
