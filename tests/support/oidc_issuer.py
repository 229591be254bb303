"""A local OpenID Connect issuer for tests: discovery, an authorization endpoint that signs in one preset
person at once, and a token endpoint that checks the PKCE verifier, the redirect URI and the client.

``async with oidc_issuer(tokens) as issuer`` serves on 127.0.0.1; ``issuer.user`` holds the claims of who
signs in (given to ``tokens(**claims)`` for the access token), ``issuer.codes`` the codes handed out,
``issuer.refusals`` why the token endpoint refused, and ``issuer.deny`` makes the authorization endpoint
send back ``error=access_denied``.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode

from aiohttp import web

__all__ = ["CLIENT_ID", "OidcIssuer", "oidc_issuer"]

CLIENT_ID = "toolbooth-inbox"


@dataclass
class OidcIssuer:
    url: str
    tokens: Callable[..., str]
    redirect_uri: str = ""  # the registered one: set by the test once it knows the inbox's port
    client_secret: str | None = None
    user: dict[str, Any] = field(default_factory=lambda: {"sub": "bob", "roles": ["approver"]})
    deny: bool = False
    codes: dict[str, dict[str, str]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    authorizations: list[dict[str, str]] = field(default_factory=list)

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
                                  "token_endpoint": f"{self.url}/token", "response_types_supported": ["code"],
                                  "code_challenge_methods_supported": ["S256"]})

    async def authorize(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.authorizations.append(query)
        assert query["response_type"] == "code" and query["client_id"] == CLIENT_ID, query
        assert query["redirect_uri"] == self.redirect_uri and query["code_challenge_method"] == "S256", query
        assert "openid" in query["scope"].split(), query
        if self.deny:
            back = {"error": "access_denied", "state": query["state"]}
        else:
            code = secrets.token_urlsafe(16)
            self.codes[code] = {"challenge": query["code_challenge"], "redirect_uri": query["redirect_uri"]}
            back = {"code": code, "state": query["state"]}
        raise web.HTTPFound(f"{query['redirect_uri']}?{urlencode(back)}")

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        issued = self.codes.pop(str(form.get("code")), None)  # a code is redeemed once
        verifier = str(form.get("code_verifier", ""))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        client = _basic(request.headers.get("Authorization"))
        why = ("unknown or used code" if issued is None else
               "wrong grant type" if form.get("grant_type") != "authorization_code" else
               "wrong redirect URI" if form.get("redirect_uri") != issued["redirect_uri"] else
               "wrong code verifier" if challenge != issued["challenge"] else
               "wrong client" if form.get("client_id") != CLIENT_ID else
               "wrong client secret" if self.client_secret is not None and (
                   client != (CLIENT_ID, self.client_secret)) else None)
        if why is not None:
            self.refusals.append(why)
            return web.json_response({"error": "invalid_grant", "error_description": why}, status=400)
        return web.json_response({"access_token": self.tokens(**self.user), "token_type": "Bearer",
                                  "expires_in": 300})


def _basic(header: str | None) -> tuple[str, str] | None:
    """The client id and secret of an ``Authorization: Basic`` header (each part form-encoded)."""
    if header is None or not header.startswith("Basic "):
        return None
    login, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
    return unquote(login), unquote(password)


@asynccontextmanager
async def oidc_issuer(tokens: Callable[..., str]) -> AsyncIterator[OidcIssuer]:
    """Serve an ``OidcIssuer`` on 127.0.0.1 until the block ends."""
    issuer = OidcIssuer("", tokens)
    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", issuer.discovery)
    app.router.add_get("/authorize", issuer.authorize)
    app.router.add_post("/token", issuer.token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    issuer.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield issuer
    finally:
        await runner.cleanup()
