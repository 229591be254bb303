"""A browser-like HTTP client of the approval inbox: keeps its cookies, follows no redirects, reads forms' fields.

``Browser(url)`` talks to a real inbox listener over aiohttp; every answer is a ``Page`` with its status,
headers, text and the cookies it set (as ``http.cookies.Morsel``s, for their flags).
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookies import Morsel, SimpleCookie

import aiohttp
from multidict import CIMultiDictProxy

__all__ = ["Browser", "Page"]

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

    async def sign_in(self, token: str | None = None) -> Page:
        """Open the sign-in page and send it with ``token`` (dev mode: none)."""
        form = await self.get("/sign-in")
        fields = {"csrf": form.hidden("csrf")} | ({} if token is None else {"token": token})
        return await self.post("/sign-in", fields)

    async def close(self) -> None:
        await self._http.close()

    async def _send(self, method: str, path: str, fields: dict[str, str] | None,
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
