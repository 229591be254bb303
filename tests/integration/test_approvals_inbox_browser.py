"""The approval inbox in a real browser: Debian's headless Chromium, driven by Playwright, against a real sidecar.

A person signs in by pasting a token, reads the held email as the tool rendered it, approves it with the
keyboard and the agent's retry over gRPC sends it once; another call is denied with a reason; a person
signs in through an identity provider (the authorization code flow with PKCE, a local test issuer). The page's
script cannot read the session cookie, and its style sheet loads under the strict Content-Security-Policy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from sidecar.canonical import canonical_json, sha256_hex
from sidecar.config import Settings
from sidecar.contract import ErrorCode, PreviewState, Status
from sidecar.server.approvals_ui.pages import CHANGED, EXPIRED, FORGED, NOT_PENDING
from sidecar.state import PreviewQuery
from tests.support.approvals import NOTE
from tests.support.contract_tools import SENT
from tests.support.inbox import MAIL, World, free_port, served_inbox
from tests.support.oidc_issuer import CLIENT_ID, oidc_issuer
from tests.support.required import missing

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package (.ci/run installs it)
_LIVE_MS = 15_000  # the deadline of a live update (it comes within approvals_ui.live_seconds, 0.2 s here)


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str]) -> AsyncIterator[World]:
    settings = make_settings(auth=jwt_auth, approvals_ui={"listen": "127.0.0.1:0", "live_seconds": 0.2})
    async with served_inbox(settings, make_token, tmp_path) as world:
        yield world


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        missing("no Chromium at /usr/bin/chromium", install="apt-get install chromium; .ci/run installs it")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            await browser.close()


async def signed_in(chromium: Browser, world: World, sub: str = "bob", roles: tuple[str, ...] = ("approver",),
                    **context: Any) -> Page:
    page = await (await chromium.new_context(**context)).new_page()
    await page.goto(world.inbox.url + "/sign-in")
    await page.get_by_label("Access token").fill(world.tokens(sub=sub, roles=list(roles)))
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url("**/inbox")
    return page


async def test_sign_in_read_the_email_approve_it_and_the_agents_retry_sends_it_once(
        chromium: Browser, world: World) -> None:
    draft = await world.client().execute("send_email_preview", MAIL)
    arguments = {"preview_id": draft.data["preview_id"]}
    held = await world.client().execute("send_email", arguments, idempotency_key="m-1", conversation_id="c-9")
    assert held.preview is not None
    page = await signed_in(chromium, world)
    await page.get_by_role("heading", name="Waiting for your decision").wait_for()
    assert await page.evaluate("document.cookie") == ""  # HttpOnly: no script can read the session
    header = await page.locator("header.bar").evaluate("e => getComputedStyle(e).backgroundColor")
    assert header == "rgb(18, 38, 63)"  # the style sheet loaded under the CSP
    await page.get_by_role("link", name="Review and decide on send_email by alice (acme)").click()
    await page.get_by_role("heading", name="What it will do").wait_for()
    body = await page.locator("main").inner_text()
    assert "Deployment complete" in body and "ana@example.com" in body and "Rollback plan attached." in body
    assert "c-9" in body and "alice (acme)" in body
    await page.get_by_label("Comment (optional)").focus()
    await page.keyboard.type("checked the recipients")
    await page.keyboard.press("Tab")  # to the Approve button
    await page.keyboard.press("Enter")
    await page.get_by_role("status").wait_for()
    assert "You approved send_email requested by alice (acme): “checked the recipients”." == \
        await page.get_by_role("status").inner_text()
    before = len(SENT)
    sent = await world.client().execute("send_email", arguments, idempotency_key="m-2", conversation_id="c-9",
                                        approval_id=held.preview.preview_id)
    assert sent.status is Status.SUCCESS and len(SENT) == before + 1
    again = await world.client().execute("send_email", arguments, idempotency_key="m-3", conversation_id="c-9",
                                         approval_id=held.preview.preview_id)
    assert again.error is not None and again.error.code is ErrorCode.PERMISSION_DENIED and len(SENT) == before + 1


async def test_deny_with_a_reason_in_the_browser(chromium: Browser, world: World) -> None:
    preview = await world.held_note()
    page = await signed_in(chromium, world)
    await page.goto(f"{world.inbox.url}/previews/{preview.preview_id}")
    await page.get_by_role("button", name="Deny").click()  # the reason is required: the browser keeps the form
    assert page.url.endswith(f"/previews/{preview.preview_id}")
    await page.get_by_label("Reason (required)").fill("not this week")
    await page.get_by_role("button", name="Deny").click()
    await page.get_by_role("status").wait_for()
    assert "You denied file_note" in await page.get_by_role("status").inner_text()
    retry = await world.client().execute("file_note", NOTE, idempotency_key="k-9",
                                         approval_id=preview.preview_id)
    assert retry.error is not None and "not this week" in retry.error.message


async def test_sign_in_through_the_identity_provider(chromium: Browser, tmp_path: Path,
                                                     make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                                                     make_token: Callable[..., str]) -> None:
    async with oidc_issuer(make_token) as issuer:
        port = free_port()
        issuer.redirect_uri = f"http://127.0.0.1:{port}/sign-in/callback"
        settings = make_settings(auth=jwt_auth, approvals_ui={"listen": f"127.0.0.1:{port}", "oidc": {
            "issuer": issuer.url, "client_id": CLIENT_ID, "redirect_uri": issuer.redirect_uri}})
        async with served_inbox(settings, make_token, tmp_path / "oidc") as world:
            preview = await world.held_note()
            page = await (await chromium.new_context()).new_page()
            await page.goto(world.inbox.url + "/sign-in")
            await page.get_by_role("link", name="Sign in with your identity provider").click()
            await page.get_by_role("heading", name="Waiting for your decision").wait_for()  # via the signed-in page
            assert page.url == world.inbox.url + "/inbox" and len(issuer.authorizations) == 1
            assert "Signed in as bob (acme)" in await page.locator("header").inner_text()
            assert preview.preview_id in await page.content()
            assert await page.evaluate("document.cookie") == ""


async def test_an_expired_preview_shows_as_expired_and_cannot_be_approved(chromium: Browser, world: World) -> None:
    preview = await world.held_note()
    live = await signed_in(chromium, world)  # a page left open
    static = await signed_in(chromium, world, java_script_enabled=False)  # a page without script
    for page in (live, static):
        await page.goto(f"{world.inbox.url}/previews/{preview.preview_id}")
        await page.get_by_role("button", name="Approve").wait_for()
    await world.store.driver.execute("UPDATE previews SET expires_at = ? WHERE preview_id = ?",
                                     (time.time() - 1, preview.preview_id))
    await live.get_by_text("Expired.", exact=True).wait_for(timeout=_LIVE_MS)  # told, without a reload
    assert await live.get_by_role("button", name="Approve").count() == 0
    assert "it cannot be approved or denied any more" in await live.locator("main").inner_text()
    async with static.expect_response(lambda r: r.url.endswith("/approve")) as answer:
        await static.get_by_role("button", name="Approve").click()  # the form it still shows
    assert (await answer.value).status == 410
    assert await static.get_by_role("alert").inner_text() == EXPIRED
    assert await static.get_by_role("button", name="Approve").count() == 0
    pending = await world.store.previews(PreviewQuery(PreviewState.PENDING, 100))
    assert [p.state for p in pending] == [PreviewState.PENDING]
    await live.goto(world.inbox.url + "/inbox")  # the inbox lists it as expired, not as waiting
    expired = live.locator(f"#preview-{preview.preview_id}")
    assert "expired" in await expired.inner_text() and "Nothing is waiting for you" in await live.content()


async def test_the_expiry_counts_down_on_an_open_page(chromium: Browser, world: World) -> None:
    preview = await world.held_note()
    page = await signed_in(chromium, world)
    await page.clock.install()  # the page's clock, moved on below without waiting for it
    await page.goto(f"{world.inbox.url}/previews/{preview.preview_id}")
    countdown = page.locator(".countdown")
    await expect(countdown).to_have_text(re.compile(r"^\d+ min left$"))
    left_ms = await page.evaluate("Date.parse(document.querySelector('[data-expires-at]').dataset.expiresAt)"
                                  " - Date.now()")
    await page.clock.fast_forward(int(left_ms) - 30_000)
    await expect(countdown).to_have_text(re.compile(r"^(2\d|30) s left$"))
    await page.clock.fast_forward(31_000)
    await expect(countdown).to_have_text("expired")


async def test_a_person_without_the_approver_role_is_not_signed_in(chromium: Browser, world: World) -> None:
    carol = await (await chromium.new_context()).new_page()
    await carol.goto(world.inbox.url + "/sign-in")
    await carol.get_by_label("Access token").fill(world.tokens(sub="carol", roles=["developer"]))
    await carol.get_by_role("button", name="Sign in").click()
    await expect(carol.get_by_role("heading", name="Not an approver")).to_be_visible()
    assert "carol holds none of the roles that may approve calls here" in await carol.get_by_role("alert").inner_text()
    assert not [c for c in await carol.context.cookies() if c["name"] == "toolbooth-session"]


async def test_an_approver_sees_nothing_of_their_own_call(chromium: Browser, world: World) -> None:
    bob = await signed_in(chromium, world)
    alice = await signed_in(chromium, world, sub="alice", roles=("approver",))  # the requester of the note
    preview = await world.held_note()
    await bob.locator(f"#preview-{preview.preview_id}").wait_for(timeout=_LIVE_MS)  # bob's page shows it, live
    await alice.reload()
    assert "Nothing is waiting for you." in await alice.locator("main").inner_text()
    assert preview.preview_id not in await alice.content()
    answer = await alice.goto(f"{world.inbox.url}/previews/{preview.preview_id}")
    assert answer is not None and answer.status == 404
    assert await alice.get_by_role("alert").inner_text() == NOT_PENDING
    await alice.goto(world.inbox.url + "/history")
    assert "No decisions yet." in await alice.locator("main").inner_text()


async def test_hidden_characters_of_a_held_call_are_seen_marked_and_isolated(chromium: Browser, world: World) -> None:
    held = await world.client().execute("file_note", {**NOTE, "title": "pay \u202e9876\u202c, not 10\u200b0"},
                                        idempotency_key="k-h")
    assert held.preview is not None
    page = await signed_in(chromium, world)
    await page.goto(f"{world.inbox.url}/previews/{held.preview.preview_id}")
    title = page.locator(".fields .field").filter(has=page.locator("dt", has_text="Title")).locator("dd")
    await expect(title).to_have_text("pay ⟦U+202E⟧9876⟦U+202C⟧, not 10⟦U+200B⟧0")  # not "pay 6789, not 100"
    marks = title.locator(".mark")
    assert await marks.count() == 3 and await marks.first.is_visible()
    assert await title.locator("bdi").evaluate("value => getComputedStyle(value).unicodeBidi") == "isolate"


async def test_a_forged_form_post_without_the_csrf_token_is_refused(chromium: Browser, world: World) -> None:
    preview = await world.held_note()
    page = await signed_in(chromium, world)
    url = f"{world.inbox.url}/previews/{preview.preview_id}/approve"
    for form in ({"preview_hash": preview.preview_hash}, {"preview_hash": preview.preview_hash, "csrf": "forged"}):
        forged = await page.request.post(url, form=form, max_redirects=0)  # the browser's own cookie goes along
        assert forged.status == 403 and FORGED.replace("'", "&#39;") in await forged.text()
    stranger = await (await chromium.new_context()).new_page()  # no session at all
    alone = await stranger.request.post(url, form={"preview_hash": preview.preview_hash}, max_redirects=0)
    assert alone.status == 401
    pending = await world.store.previews(PreviewQuery(PreviewState.PENDING, 100))
    assert [p.state for p in pending] == [PreviewState.PENDING]


async def test_an_approve_click_on_a_preview_whose_hash_changed_is_refused(chromium: Browser, world: World) -> None:
    preview = await world.held_note()
    page = await signed_in(chromium, world)
    await page.goto(f"{world.inbox.url}/previews/{preview.preview_id}")
    shown = await page.locator('input[name="preview_hash"]').get_attribute("value")
    call = json.loads(preview.call_json)
    call["arguments"]["title"] = "changed behind the page"
    await world.store.driver.execute("UPDATE previews SET call_json = ?, preview_hash = ? WHERE preview_id = ?",
                                     (canonical_json(call), sha256_hex(call), preview.preview_id))
    async with page.expect_response(lambda r: r.url.endswith("/approve")) as answer:
        await page.get_by_role("button", name="Approve").click()
    assert (await answer.value).status == 409 and shown == preview.preview_hash
    assert await page.get_by_role("alert").inner_text() == CHANGED
    assert "changed behind the page" in await page.locator("main").inner_text()  # shown as it is now
    assert await page.locator('input[name="preview_hash"]').get_attribute("value") == sha256_hex(call)
    [still] = await world.store.previews(PreviewQuery(PreviewState.PENDING, 100))
    assert still.decided_by is None


async def test_a_new_preview_appears_without_a_reload(chromium: Browser, world: World) -> None:
    page = await signed_in(chromium, world)
    await page.get_by_text("Nothing is waiting for you.").wait_for()
    await page.evaluate("window.notReloaded = true")
    first = await world.held_note("k-1")
    await page.locator(f"#preview-{first.preview_id}").wait_for(timeout=_LIVE_MS)
    second = await world.held_note("k-2")
    await page.locator(f"#preview-{second.preview_id}").wait_for(timeout=_LIVE_MS)
    assert await page.evaluate("window.notReloaded") is True  # swapped in by the script, not reloaded
    assert "2 pending, newest first." in await page.locator("main").inner_text()
    assert (await page.get_by_role("status").inner_text()).startswith("Updated at ")


# In the page: what an accessibility check finds wrong, as lists of short descriptions.
_AUDIT = """() => {
  const visible = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const describe = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + " " +
    (e.textContent || e.getAttribute("name") || "").trim().slice(0, 40);
  const rgba = (text) => text.match(/[\\d.]+/g).map(Number);
  const luminance = ([r, g, b]) => {
    const [R, G, B] = [r, g, b].map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * R + 0.7152 * G + 0.0722 * B;
  };
  const background = (e) => {
    for (let at = e; at; at = at.parentElement) {
      const color = rgba(getComputedStyle(at).backgroundColor);
      if (color.length < 4 || color[3] > 0) { return color; }
    }
    return [255, 255, 255];
  };
  const lowContrast = [];
  for (const e of document.querySelectorAll("body *")) {
    const own = Array.from(e.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || !visible(e)) { continue; }
    const style = getComputedStyle(e);
    const [a, b] = [luminance(rgba(style.color)), luminance(background(e))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const large = parseFloat(style.fontSize) >= 24 || (parseFloat(style.fontSize) >= 18.66 && +style.fontWeight >= 700);
    if (ratio < (large ? 3 : 4.5)) { lowContrast.push(describe(e) + " " + ratio.toFixed(2)); }
  }
  const controls = Array.from(document.querySelectorAll("input:not([type=hidden]), select, textarea"));
  const unlabeled = controls.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label"));
  const targets = Array.from(document.querySelectorAll("button, select, textarea, a.button, nav a"))
    .filter((e) => visible(e) && e.getBoundingClientRect().height < 24);
  const ids = Array.from(document.querySelectorAll("[id]")).map((e) => e.id);
  return {
    lowContrast, unlabeled: unlabeled.map(describe), smallTargets: targets.map(describe),
    duplicateIds: ids.filter((id, i) => ids.indexOf(id) !== i),
    overflow: document.documentElement.scrollWidth > window.innerWidth,
    unnamedLandmarks: Array.from(document.querySelectorAll("nav, section, form")).filter((e) =>
      e.tagName !== "FORM" && !e.getAttribute("aria-label") && !e.getAttribute("aria-labelledby")).map(describe),
  };
}"""
_SHOTS = ("inbox", "preview", "history", "inbox-phone", "expired-phone")  # those docs/approvals.md shows
_NOTHING_WRONG = {"lowContrast": [], "unlabeled": [], "smallTargets": [], "duplicateIds": [], "overflow": False,
                  "unnamedLandmarks": []}
_FOCUSED = """() => { const e = document.activeElement; const s = getComputedStyle(e);
  const named = e.labels && e.labels.length ? e.labels[0].textContent : e.textContent || e.getAttribute("aria-label");
  return [(named || e.tagName).replace(/\\s+/g, " ").trim(),
          s.outlineStyle !== "none" && parseFloat(s.outlineWidth) >= 2]; }"""


async def tab_order(page: Page, stops: int) -> list[str]:
    """The names of the first ``stops`` elements the Tab key reaches; each must show its focus."""
    names = []
    for _ in range(stops):
        await page.keyboard.press("Tab")
        name, outlined = await page.evaluate(_FOCUSED)
        assert outlined, f"{name!r} shows no focus outline"
        names.append(name)
    return names


async def test_accessible_and_readable_on_a_phone(chromium: Browser, world: World, tmp_path: Path) -> None:
    draft = await world.client().execute("send_email_preview", MAIL)
    email = await world.client().execute("send_email", {"preview_id": draft.data["preview_id"]},
                                         idempotency_key="m-1", conversation_id="release-42")
    note = await world.client().execute("file_note", {"title": "standup notes", "body": "ship on Friday"},
                                        idempotency_key="n-1", conversation_id="standup-3")
    assert email.preview is not None and note.preview is not None
    done, gone = await world.held_note("k-1"), await world.held_note("k-2")  # one decided and run, one expired
    bob = await world.signed_in()
    csrf = (await bob.get("/inbox")).hidden("csrf")
    approved = await bob.post(f"/previews/{done.preview_id}/approve",
                              {"csrf": csrf, "preview_hash": done.preview_hash, "comment": "fine"})
    assert approved.status == 200
    ran = await world.client().execute("file_note", NOTE, idempotency_key="k-1", approval_id=done.preview_id)
    assert ran.status is Status.SUCCESS
    await world.store.driver.execute("UPDATE previews SET created_at = ?, expires_at = ? WHERE preview_id = ?",
                                     (time.time() - 960, time.time() - 60, gone.preview_id))
    await world.store.flush_audit()
    stranger = await (await chromium.new_context(viewport={"width": 390, "height": 844})).new_page()
    await stranger.goto(world.inbox.url + "/sign-in")
    assert await stranger.evaluate(_AUDIT) == _NOTHING_WRONG
    await stranger.context.close()
    shots = Path(os.environ.get("TOOLBOOTH_SCREENSHOTS") or tmp_path)  # set it to refresh docs/images
    for width, height, suffix in ((1000, 900, ""), (390, 844, "-phone")):
        page = await signed_in(chromium, world, viewport={"width": width, "height": height})
        await page.get_by_text("2 pending, newest first.").wait_for()
        assert "Expired before anyone decided" in await page.locator("main").inner_text()
        await page.evaluate("document.activeElement.blur()")
        assert await tab_order(page, 8) == [
            "Skip to content", "Toolbooth approvals", "Inbox", "History", "Sign out", "Tool", "Requested by", "Filter"]
        assert (await tab_order(page, 2))[1] == "Review and decide on file_note by alice (acme)"  # newest first
        pages = {"inbox": "/inbox", "preview": f"/previews/{email.preview.preview_id}", "history": "/history",
                 "expired": f"/previews/{gone.preview_id}"}
        for name, path in pages.items():
            await page.goto(world.inbox.url + path)
            found = await page.evaluate(_AUDIT)
            assert found == _NOTHING_WRONG, (name, width, found)
            if f"{name}{suffix}" in _SHOTS:
                await page.screenshot(path=shots / f"approvals-{name}{suffix}.png", full_page=True)
        await page.goto(world.inbox.url + pages["preview"])
        await page.get_by_label("Comment (optional)").focus()
        assert await tab_order(page, 3) == ["Approve", "Reason (required)", "Deny"]
        await page.context.close()
