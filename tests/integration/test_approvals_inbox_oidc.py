"""Signing in to the approval inbox through an identity provider: the authorization code flow with PKCE against
a local test issuer, through a real sidecar. The access token is verified by auth.jwt as an agent's token is;
a login finishes once, in the browser that started it, and every refusal signs nobody in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest

from sidecar.config import Settings, parse_settings
from sidecar.contract import Status
from sidecar.errors import ConfigError
from tests.support.approvals import NOTE
from tests.support.inbox import Browser, Page, World, free_port, served_inbox
from tests.support.oidc_issuer import CLIENT_ID, OidcIssuer, oidc_issuer

pytestmark = pytest.mark.integration


@dataclass
class Oidc:
    world: World
    issuer: OidcIssuer

    async def start(self, browser: Browser) -> Page:
        """Follow the sign-in page's link to the identity provider: the answer sends the browser there."""
        form = await browser.get("/sign-in")
        assert "Sign in with your identity provider" in form.text
        started = await browser.get("/sign-in/oidc")
        assert started.status == 303 and (started.location or "").startswith(f"{self.issuer.url}/authorize?")
        return started

    async def provider(self, started: Page) -> str:
        """What the provider sends the browser back to (the inbox's callback, as a path)."""
        async with aiohttp.ClientSession() as http, http.get(started.location or "", allow_redirects=False) as sent:
            assert sent.status == 302
            back = sent.headers["Location"]
        assert back.startswith(self.world.inbox.url)
        return back.removeprefix(self.world.inbox.url)

    async def signed_in(self, browser: Browser) -> Page:
        return await browser.get(await self.provider(await self.start(browser)))


@pytest.fixture
def client_secret() -> dict[str, str | None]:
    """The client secret the inbox is configured with and the one the issuer expects (tests parametrize it)."""
    return {"inbox": None, "issuer": None}


@pytest.fixture
async def oidc(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
               make_token: Callable[..., str], client_secret: dict[str, str | None]) -> AsyncIterator[Oidc]:
    async with oidc_issuer(make_token) as issuer:
        port = free_port()
        issuer.redirect_uri, issuer.client_secret = f"http://127.0.0.1:{port}/sign-in/callback", client_secret["issuer"]
        secret = {} if client_secret["inbox"] is None else {"client_secret": client_secret["inbox"]}
        settings = make_settings(auth=jwt_auth, approvals_ui={"listen": f"127.0.0.1:{port}", "oidc": {
            "issuer": issuer.url, "client_id": CLIENT_ID, "redirect_uri": issuer.redirect_uri, **secret}})
        async with served_inbox(settings, make_token, tmp_path) as world:
            yield Oidc(world, issuer)


async def test_sign_in_through_the_provider_then_approve(oidc: Oidc) -> None:
    preview = await oidc.world.held_note()
    browser = oidc.world.browser()
    started = await oidc.start(browser)
    login = started.set_cookies["toolbooth-login"]
    assert login["httponly"] is True and login["samesite"] == "lax"  # the provider's redirect back carries it
    [asked] = [parse_qs(urlsplit(started.location or "").query)]
    assert asked["code_challenge_method"] == ["S256"] and len(asked["code_challenge"][0]) == 43
    assert asked["state"] == [login.value] and asked["scope"] == ["openid"]
    back = await browser.get(await oidc.provider(started))
    assert back.status == 200 and '<meta http-equiv="refresh" content="0; url=/inbox">' in back.text
    session = back.set_cookies["toolbooth-session"]
    assert session["httponly"] is True and session["samesite"] == "strict" and "toolbooth-login" not in browser.cookies
    inbox = await browser.get("/inbox")
    assert "Signed in as <strong><bdi>bob</bdi></strong> (<bdi>acme</bdi>)" in inbox.text
    assert preview.preview_id in inbox.text
    approved = await browser.post(f"/previews/{preview.preview_id}/approve",
                                  {"csrf": inbox.hidden("csrf"), "preview_hash": preview.preview_hash})
    assert approved.status == 200 and "You approved" in approved.text
    ran = await oidc.world.client().execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert ran.status is Status.SUCCESS


async def test_a_login_finishes_once_and_only_in_the_browser_that_started_it(oidc: Oidc) -> None:
    mine, other = oidc.world.browser(), oidc.world.browser()
    callback = await oidc.provider(await oidc.start(mine))
    stolen = await other.get(callback)  # another browser, without this login's cookie
    assert stolen.status == 403 and "did not start in this browser" in stolen.text
    assert "toolbooth-session" not in stolen.set_cookies
    assert (await mine.get(callback)).status == 200
    kept = dict(mine.cookies)
    replayed = Browser(mine.url)
    oidc.world.browsers.append(replayed)
    replayed.cookies.update(kept)
    replayed.cookies["toolbooth-login"] = parse_qs(urlsplit(callback).query)["state"][0]  # its cookie, put back
    again = await replayed.get(callback)
    assert again.status == 401 and "this sign-in expired or was already used" in again.text


async def test_a_code_the_provider_refuses_signs_nobody_in(oidc: Oidc) -> None:
    browser = oidc.world.browser()
    started = await oidc.start(browser)
    callback = await oidc.provider(started)
    for issued in oidc.issuer.codes.values():
        issued["challenge"] = "not-the-challenge"  # as if the verifier were another one
    page = await browser.get(callback)
    assert page.status == 401 and "the identity provider did not issue a token" in page.text
    assert oidc.issuer.refusals == ["wrong code verifier"] and "toolbooth-session" not in page.set_cookies


async def test_a_refusal_by_the_provider_is_said(oidc: Oidc) -> None:
    oidc.issuer.deny = True
    browser = oidc.world.browser()
    page = await oidc.signed_in(browser)
    assert page.status == 401
    assert "Not signed in: the identity provider refused the sign-in: access_denied." in page.text
    assert "toolbooth-session" not in page.set_cookies and "toolbooth-login" not in browser.cookies


async def test_a_token_for_someone_without_the_role_signs_nobody_in(oidc: Oidc) -> None:
    oidc.issuer.user = {"sub": "carol", "roles": ["developer"]}
    browser = oidc.world.browser()
    page = await oidc.signed_in(browser)
    assert page.status == 403 and "carol holds none of the roles that may approve calls here" in page.text
    assert "toolbooth-session" not in browser.cookies and "toolbooth-login" not in browser.cookies


@pytest.mark.parametrize("client_secret", [{"inbox": "s3cret-of-the-inbox", "issuer": "s3cret-of-the-inbox"}])
async def test_a_confidential_client_sends_its_secret(oidc: Oidc) -> None:
    assert (await oidc.signed_in(oidc.world.browser())).status == 200


@pytest.mark.parametrize("client_secret", [{"inbox": "wrong-secret", "issuer": "s3cret-of-the-inbox"}])
async def test_a_wrong_client_secret_signs_nobody_in(oidc: Oidc) -> None:
    page = await oidc.signed_in(oidc.world.browser())
    assert page.status == 401 and oidc.issuer.refusals == ["wrong client secret"]


async def test_an_unreachable_provider_is_said(make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                                               make_token: Callable[..., str], tmp_path: Path) -> None:
    port = free_port()
    settings = make_settings(auth=jwt_auth, approvals_ui={"listen": f"127.0.0.1:{port}", "oidc": {
        "issuer": f"http://127.0.0.1:{free_port()}", "client_id": CLIENT_ID,
        "redirect_uri": f"http://127.0.0.1:{port}/sign-in/callback", "timeout_seconds": 5}})
    async with served_inbox(settings, make_token, tmp_path) as world:
        browser = world.browser()
        form = await browser.get("/sign-in")
        assert 'href="/sign-in/oidc"' in form.text
        page = await browser.get("/sign-in/oidc")
        assert page.status == 503 and "the identity provider cannot be reached" in page.text


@pytest.mark.parametrize(("oidc_section", "message"), [
    ({"issuer": "http://idp.example", "redirect_uri": "https://a.example/sign-in/callback"},
     r"oidc\.issuer: 'http://idp\.example': the issuer must use https:// \(http:// only on a loopback host\)"),
    ({"issuer": "https://idp.example", "redirect_uri": "https://a.example/callback"},
     r"oidc\.redirect_uri: 'https://a\.example/callback': the redirect URI is the inbox's own /sign-in/callback"),
    ({"issuer": "https://idp.example", "redirect_uri": "https://a.example/sign-in/callback", "scopes": ["email"]},
     r"oidc\.scopes: the scopes must include 'openid'"),
    ({"issuer": "idp.example", "redirect_uri": "https://a.example/sign-in/callback"},
     r"oidc\.issuer: 'idp\.example': the issuer must be an absolute https:// URL"),
])
def test_bad_oidc_settings_name_the_key(jwt_auth: dict[str, Any], oidc_section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"config error at approvals_ui\.{message}"):
        parse_settings({"auth": jwt_auth, "approvals_ui": {"oidc": {"client_id": CLIENT_ID, **oidc_section}}})


def test_oidc_needs_jwt_auth() -> None:
    with pytest.raises(ConfigError, match=r"approvals_ui\.oidc: signing in through an identity provider needs "
                                          r"auth\.jwt"):
        parse_settings({"approvals_ui": {"oidc": {"issuer": "https://idp.example", "client_id": CLIENT_ID,
                                                  "redirect_uri": "https://a.example/sign-in/callback"}}})
