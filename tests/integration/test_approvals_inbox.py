"""The approval inbox through a real sidecar: a person signs in with a real token, sees the pending preview
rendered, approves or denies it through the same approvals as the RPCs (the agent's retry over gRPC then runs
once), and every forged, stale or unauthorized form changes nothing; every response carries strict headers."""

from __future__ import annotations

import asyncio
import calendar
import html
import json
import logging
import math
import re
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from sidecar.canonical import canonical_json, sha256_hex
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Preview, PreviewState, Status
from sidecar.errors import StoreUnavailableError
from sidecar.server.approvals_ui.live import RETRY_AFTER_SECONDS
from sidecar.server.approvals_ui.pages import CHANGED, EXPIRED, FORGED
from sidecar.server.approvals_ui.security import HEADERS
from sidecar.state import PreviewQuery, PreviewRecord
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.approvals import NOTE
from tests.support.inbox import MAIL, Browser, Page, World, served_inbox
from tests.support.waiting import past, until

pytestmark = pytest.mark.integration


@pytest.fixture
def ui() -> dict[str, Any]:
    """Settings of the ``approvals_ui`` section besides ``listen`` (a test parametrizes it to change them)."""
    return {}


@pytest.fixture
def approval() -> dict[str, Any]:
    """Approval data merged into the test policies (a test parametrizes it to change them)."""
    return {}


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str], ui: dict[str, Any], approval: dict[str, Any]) -> AsyncIterator[World]:
    settings = make_settings(auth=jwt_auth, approvals_ui={"listen": "127.0.0.1:0", **ui})
    async with served_inbox(settings, make_token, tmp_path, **approval) as world:
        yield world


def strict(page: Page) -> None:
    for name, value in HEADERS.items():
        assert page.headers.get(name) == value, (name, page.headers)
    policy = dict(part.strip().partition(" ")[::2] for part in HEADERS["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["connect-src"] == "'self'"  # the app's own script, no inline
    assert all(tag.startswith('<script src="/static/') for tag in re.findall(r"<script[^>]*>", page.text))


async def test_a_signed_in_approver_sees_the_pending_email_rendered(world: World) -> None:
    draft = await world.client().execute("send_email_preview", MAIL)
    held = await world.client().execute("send_email", {"preview_id": draft.data["preview_id"]}, idempotency_key="m-1",
                                        conversation_id="conv-7")
    assert held.preview is not None
    token = world.tokens(sub="bob", roles=["approver"])
    bob = world.browser()
    form = await bob.get("/sign-in")
    strict(form)
    signed_in = await bob.post("/sign-in", {"csrf": form.hidden("csrf"), "token": token})
    assert (signed_in.status, signed_in.location) == (303, "/inbox")
    inbox = await bob.get("/inbox")
    strict(inbox)
    assert inbox.status == 200 and "send_email" in inbox.text and "alice (acme)" in inbox.text
    assert "conv-7" in inbox.text and "the tool&#39;s effects are external and irreversible" in inbox.text
    assert f'href="/previews/{held.preview.preview_id}"' in inbox.text and " left</span>)" in inbox.text
    detail = await bob.get(f"/previews/{held.preview.preview_id}")
    strict(detail)
    assert detail.status == 200 and "What it will do" in detail.text
    assert "<dt><bdi>Subject</bdi></dt>" in detail.text and "Deployment complete" in detail.text
    assert "<dt><bdi>To</bdi></dt>" in detail.text and "ana@example.com" in detail.text
    body = "The new version has been deployed.\nRollback plan attached."
    assert f'<pre class="text"><bdi>{body}</bdi></pre>' in detail.text
    assert detail.hidden("preview_hash") == held.preview.preview_hash
    for page in (form, signed_in, inbox, detail):
        assert token not in page.text and token not in str(page.headers)  # the token never comes back


async def test_masked_arguments_stay_masked(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    detail = await bob.get(f"/previews/{preview.preview_id}")
    masked = json.loads(preview.call_json)["arguments"]["body"]
    assert masked.startswith("hmac-sha256:") and masked in detail.text and 'class="badge"' in detail.text
    assert NOTE["body"] not in detail.text and "The call's arguments" in detail.text


async def test_approving_in_the_inbox_lets_the_agents_retry_run_once(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    detail = await bob.get(f"/previews/{preview.preview_id}")
    approved = await bob.post(f"/previews/{preview.preview_id}/approve", {
        "csrf": detail.hidden("csrf"), "preview_hash": detail.hidden("preview_hash"), "comment": "looks right"})
    strict(approved)
    assert approved.status == 200 and "You approved" in approved.text and "looks right" in approved.text
    before = tools.CREATED.value
    agent = world.client()
    ran = await agent.execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert ran.status is Status.SUCCESS and tools.CREATED.value == before + 1
    again = await agent.execute("file_note", NOTE, idempotency_key="k-3", approval_id=preview.preview_id)
    assert again.error is not None and again.error.code is ErrorCode.PERMISSION_DENIED
    assert tools.CREATED.value == before + 1
    await world.store.flush_audit()
    [event] = [e for e in await world.store.audit_events() if "approver" in json.loads(e.decisions_json)]
    assert (event.principal_id, event.tenant, event.status, event.input_hash) == (
        "bob", "acme", "approved", preview.preview_hash)
    assert json.loads(event.decisions_json)["approver"]["comment"] == "looks right"
    inbox = await bob.get("/inbox")
    assert preview.preview_id not in inbox.text and "Nothing is waiting for you" in inbox.text


async def test_denying_needs_a_reason_and_refuses_the_agents_retry(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    detail = await bob.get(f"/previews/{preview.preview_id}")
    for blank in (" ", "\u200b\u200b", "\ufeff", "\u00a0\u2028", "\u2060\u180e "):  # nothing one can read
        no_reason = await bob.post(f"/previews/{preview.preview_id}/deny", {"csrf": detail.hidden("csrf"),
                                                                            "reason": blank})
        assert no_reason.status == 400 and "Nothing was denied: a denial needs a reason." in no_reason.text
    assert [p.preview_id for p in await world.pending()] == [preview.preview_id]
    denied = await bob.post(f"/previews/{preview.preview_id}/deny",
                            {"csrf": detail.hidden("csrf"), "reason": "wrong project"})
    assert denied.status == 200 and "You denied" in denied.text
    retry = await world.client().execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert retry.error is not None and retry.error.code is ErrorCode.PERMISSION_DENIED
    assert "wrong project" in retry.error.message
    twice = await bob.post(f"/previews/{preview.preview_id}/approve",
                           {"csrf": detail.hidden("csrf"), "preview_hash": preview.preview_hash})
    assert twice.status == 409 and "the preview is already denied" in twice.text


def decided_card(history: Page, preview: Preview) -> str:
    """The history's card of ``preview``."""
    start = history.text.index(f'id="decided-{preview.preview_id}"')
    return history.text[start:history.text.index("</li>", start)]


async def test_the_history_shows_ones_own_decisions_and_whether_the_call_ran(world: World,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ran, waiting, denied, failed = [await world.held_note(key=f"k-{n}") for n in range(4)]
    bob = await world.signed_in()
    csrf = (await bob.get("/inbox")).hidden("csrf")
    for preview in (ran, waiting, failed):
        fields = {"csrf": csrf, "preview_hash": preview.preview_hash, "comment": f"ok {preview.preview_id}"}
        assert (await bob.post(f"/previews/{preview.preview_id}/approve", fields)).status == 200
    refused = await bob.post(f"/previews/{denied.preview_id}/deny", {"csrf": csrf, "reason": "wrong project"})
    assert refused.status == 200
    agent = world.client()
    done = await agent.execute("file_note", NOTE, idempotency_key="k-9", approval_id=ran.preview_id)
    assert done.status is Status.SUCCESS
    again = await agent.execute("file_note", NOTE, idempotency_key="k-10", approval_id=ran.preview_id)
    assert again.error is not None and again.error.code is ErrorCode.PERMISSION_DENIED  # used: refused, not run
    other = await agent.execute("file_note", {**NOTE, "title": "other"}, idempotency_key="k-11",
                                approval_id=waiting.preview_id)
    assert other.error is not None and other.error.code is ErrorCode.INVALID_ARGUMENT  # not the approved call
    late = await agent.execute("file_note", NOTE, idempotency_key="k-12", approval_id=denied.preview_id)
    assert late.error is not None and late.error.code is ErrorCode.PERMISSION_DENIED

    def broken() -> int:
        raise RuntimeError("the note service is down")

    monkeypatch.setattr(tools.CREATED, "bump", broken)
    crashed = await agent.execute("file_note", NOTE, idempotency_key="k-13", approval_id=failed.preview_id)
    assert crashed.status is Status.ERROR and crashed.error is not None
    monkeypatch.undo()
    await world.store.flush_audit()  # outcomes are queued: written soon, in order
    history = await bob.get("/history")
    strict(history)
    text = history.text
    assert history.status == 200 and text.count('class="card preview"') == 4
    assert text.index("wrong project") < text.index(f"ok {waiting.preview_id}") < text.index(f"ok {ran.preview_id}")
    assert "approved, and the call ran" in text and "approved, not used yet" in text and ">denied<" in text
    assert "Decided by</dt><dd><bdi>bob</bdi>" in text
    assert ">succeeded</strong>; 1 attempt refused (PERMISSION_DENIED)</dd>" in decided_card(history, ran)
    assert ">has not run; 1 attempt refused (INVALID_ARGUMENT)</dd>" in decided_card(history, waiting)
    assert ">has not run; 1 attempt refused (PERMISSION_DENIED)</dd>" in decided_card(history, denied)
    assert f">failed ({crashed.error.code.value})</strong>" in decided_card(history, failed)


async def test_the_history_without_a_readable_audit_log_still_lists_the_decisions(
        world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    csrf = (await bob.get("/inbox")).hidden("csrf")
    assert (await bob.post(f"/previews/{preview.preview_id}/deny", {"csrf": csrf, "reason": "no"})).status == 200

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("audit table locked (secret detail)")

    monkeypatch.setattr(world.store, "approval_audit", down)
    history = await bob.get("/history")
    assert history.status == 200 and f'id="decided-{preview.preview_id}"' in history.text
    assert "The audit log cannot be read right now: whether the calls ran is not shown." in history.text
    assert "The call</dt>" not in history.text and "secret detail" not in history.text
    assert "secret detail" in caplog.text
    dave = await world.signed_in("dave", ("approver",))  # another approver: not bob's decisions
    assert "No decisions yet." in (await dave.get("/history")).text


async def test_a_principal_without_the_approver_role_is_not_signed_in(world: World) -> None:
    preview = await world.held_note()
    carol = world.browser()
    page = await carol.sign_in(world.tokens(sub="carol", roles=["developer"]))
    assert page.status == 403 and "<title>Not an approver" in page.text and "toolbooth-session" not in carol.cookies
    assert (await carol.get(f"/previews/{preview.preview_id}")).location == "/sign-in"
    tried = await carol.post(f"/previews/{preview.preview_id}/approve", {"preview_hash": preview.preview_hash})
    assert tried.status == 401 and "You are not signed in" in tried.text
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]


async def test_an_approver_of_another_tenant_sees_and_decides_nothing(world: World) -> None:
    preview = await world.held_note()
    zoe = world.browser()
    assert (await zoe.sign_in(world.tokens(sub="zoe", tenant="globex", roles=["approver"]))).location == "/inbox"
    inbox = await zoe.get("/inbox")
    assert inbox.status == 200 and "Nothing is waiting for you" in inbox.text and preview.preview_id not in inbox.text
    assert (await zoe.get(f"/previews/{preview.preview_id}")).status == 404
    tried = await zoe.post(f"/previews/{preview.preview_id}/approve",
                           {"csrf": inbox.hidden("csrf"), "preview_hash": preview.preview_hash})
    assert tried.status == 403 and "the call belongs to another tenant" in tried.text
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]


async def test_the_requester_cannot_approve_their_own_call(world: World) -> None:
    preview = await world.held_note()
    alice = await world.signed_in("alice", ("approver",))
    assert preview.preview_id not in (await alice.get("/inbox")).text
    inbox = await alice.get("/inbox")
    tried = await alice.post(f"/previews/{preview.preview_id}/approve",
                             {"csrf": inbox.hidden("csrf"), "preview_hash": preview.preview_hash})
    assert tried.status == 403 and "nobody may approve their own call" in tried.text


@pytest.mark.parametrize("csrf", [None, "", "forged-token"])
async def test_a_post_without_the_sessions_csrf_token_changes_nothing(world: World, csrf: str | None) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    fields = {"preview_hash": preview.preview_hash} | ({} if csrf is None else {"csrf": csrf})
    forged = await bob.post(f"/previews/{preview.preview_id}/approve", fields)
    strict(forged)
    assert forged.status == 403 and FORGED.replace("'", "&#39;") in forged.text
    denied = await bob.post(f"/previews/{preview.preview_id}/deny", {"reason": "x"} | (
        {} if csrf is None else {"csrf": csrf}))
    assert denied.status == 403
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]
    other = await world.signed_in("dave", ("approver",))  # another session's token is not this one's
    theirs = (await other.get("/inbox")).hidden("csrf")
    assert (await bob.post(f"/previews/{preview.preview_id}/approve",
                           {"csrf": theirs, "preview_hash": preview.preview_hash})).status == 403
    await world.store.flush_audit()
    assert not [e for e in await world.store.audit_events() if "approver" in json.loads(e.decisions_json)]


async def test_a_post_without_a_session_changes_nothing(world: World) -> None:
    preview = await world.held_note()
    stranger = world.browser()
    tried = await stranger.post(f"/previews/{preview.preview_id}/approve", {"preview_hash": preview.preview_hash})
    assert tried.status == 401 and "You are not signed in" in tried.text
    assert (await stranger.get("/inbox")).location == "/sign-in"
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]


async def test_approving_a_preview_changed_since_the_page_was_shown_is_refused(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    detail = await bob.get(f"/previews/{preview.preview_id}")
    call = json.loads(preview.call_json)
    call["arguments"]["title"] = "changed"
    await world.store.driver.execute("UPDATE previews SET call_json = ?, preview_hash = ? WHERE preview_id = ?",
                                     (canonical_json(call), sha256_hex(call), preview.preview_id))
    stale = await bob.post(f"/previews/{preview.preview_id}/approve",
                           {"csrf": detail.hidden("csrf"), "preview_hash": detail.hidden("preview_hash")})
    assert stale.status == 409 and CHANGED in stale.text and ">changed<" in stale.text
    [still] = await world.pending()
    assert still.state is PreviewState.PENDING
    assert stale.hidden("preview_hash") == sha256_hex(call)  # the page now shows the current one


@pytest.mark.parametrize("approval", [{"preview_ttl_seconds": 2}])
async def test_an_expired_preview_cannot_be_approved(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    detail = await bob.get(f"/previews/{preview.preview_id}")
    assert " left</span>)" in detail.text
    await past(calendar.timegm(time.strptime(preview.expires_at, "%Y-%m-%dT%H:%M:%SZ")) + 1)  # shown in whole seconds
    late = await bob.post(f"/previews/{preview.preview_id}/approve",
                          {"csrf": detail.hidden("csrf"), "preview_hash": detail.hidden("preview_hash")})
    assert late.status == 410 and EXPIRED in late.text and "/approve" not in late.text and "/deny" not in late.text
    denied = await bob.post(f"/previews/{preview.preview_id}/deny", {"csrf": detail.hidden("csrf"), "reason": "late"})
    assert denied.status == 410 and EXPIRED in denied.text
    inbox = await bob.get("/inbox")  # not pending any more, but not vanished: listed as expired
    assert "Nothing is waiting for you" in inbox.text and "Expired before anyone decided" in inbox.text
    assert f'id="preview-{preview.preview_id}"' in inbox.text and "expired-badge" in inbox.text
    page = await bob.get(f"/previews/{preview.preview_id}")
    assert page.status == 200 and "<strong>Expired.</strong>" in page.text and "cannot be approved" in page.text
    assert 'data-state="expired"' in page.text and "/approve" not in page.text
    alice = await world.signed_in("alice", ("approver",))  # the requester may not decide it: not even that it expired
    assert (await alice.get(f"/previews/{preview.preview_id}")).status == 404
    assert preview.preview_id not in (await alice.get("/inbox")).text
    retry = await world.client().execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert retry.error is not None and retry.error.code is ErrorCode.PREVIEW_EXPIRED


async def test_a_failing_store_is_a_503_page_and_changes_nothing(world: World, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    detail = await bob.get(f"/previews/{preview.preview_id}")

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("database is locked (secret detail)")

    monkeypatch.setattr(world.store, "previews", down)
    monkeypatch.setattr(world.store, "get_preview", down)
    inbox = await bob.get("/inbox")
    strict(inbox)
    assert inbox.status == 503 and "The approvals cannot be read right now" in inbox.text
    assert "secret detail" not in inbox.text and "secret detail" in caplog.text
    approved = await bob.post(f"/previews/{preview.preview_id}/approve",
                              {"csrf": detail.hidden("csrf"), "preview_hash": detail.hidden("preview_hash")})
    assert approved.status == 503 and "Nothing was decided" in approved.text
    monkeypatch.undo()
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]


async def test_a_preview_changed_into_unreadable_json_is_shown_so_and_cannot_be_approved(world: World) -> None:
    preview = await world.held_note()
    await world.store.driver.execute("UPDATE previews SET call_json = ? WHERE preview_id = ?",
                                     ("{not json", preview.preview_id))
    bob = await world.signed_in()
    assert (await bob.get("/inbox")).status == 200
    detail = await bob.get(f"/previews/{preview.preview_id}")
    assert detail.status == 200 and "this stored preview is not readable" in detail.text
    tried = await bob.post(f"/previews/{preview.preview_id}/approve",
                           {"csrf": detail.hidden("csrf"), "preview_hash": preview.preview_hash})
    assert tried.status == 403 and "the stored preview no longer matches its hash" in tried.text


async def test_sign_in_refuses_bad_tokens_and_forged_forms(world: World) -> None:
    browser = world.browser()
    for token, message in [("not-a-jwt", "invalid token"), (world.tokens(exp=int(time.time()) - 5), "token expired"),
                           ("", "paste a token to sign in")]:
        page = await browser.sign_in(token)
        assert page.status == 401 and f"Not signed in: {message}." in page.text, page.text
        assert "toolbooth-session" not in page.set_cookies
    form = await browser.get("/sign-in")
    no_cookie = world.browser()  # a form posted from elsewhere: no sign-in cookie of its own
    forged = await no_cookie.post("/sign-in", {"csrf": form.hidden("csrf"), "token": world.tokens()})
    assert forged.status == 403 and "toolbooth-session" not in forged.set_cookies


async def test_the_session_cookie_is_http_only_strict_and_ends_with_the_token(world: World) -> None:
    ends = int(time.time()) + 3
    bob = world.browser()
    page = await bob.sign_in(world.tokens(sub="bob", roles=["approver"], exp=ends))
    cookie = page.set_cookies["toolbooth-session"]
    assert cookie["httponly"] is True and cookie["samesite"] == "strict" and cookie["path"] == "/"
    assert not cookie["secure"]  # a loopback listener: plain HTTP; elsewhere the cookie is Secure (__Host-)
    assert 0 < int(cookie["max-age"]) <= 3
    sign_in_cookie = (await world.browser().get("/sign-in")).set_cookies["toolbooth-sign-in"]
    assert sign_in_cookie["httponly"] is True and sign_in_cookie["samesite"] == "strict"
    assert (await bob.get("/inbox")).status == 200
    await past(ends)
    assert (await bob.get("/inbox")).location == "/sign-in"  # the session ended with the token


@pytest.mark.parametrize("ui", [{"listen": "0.0.0.0:0"}])
async def test_off_loopback_the_cookies_are_secure_host_cookies(world: World) -> None:
    port = world.inbox.url.rpartition(":")[2]
    browser = Browser(f"http://127.0.0.1:{port}")
    world.browsers.append(browser)
    form = await browser.get("/sign-in", headers={"Host": f"inbox.example:{port}"})  # any host name: a proxy's
    assert form.status == 200 and form.set_cookies["__Host-toolbooth-sign-in"]["secure"] is True
    page = await browser.sign_in(world.tokens(sub="bob", roles=["approver"]))
    cookie = page.set_cookies["__Host-toolbooth-session"]
    assert cookie["secure"] is True and cookie["httponly"] is True and cookie["samesite"] == "strict"
    assert cookie["path"] == "/" and not cookie["domain"]  # what the __Host- prefix requires
    assert "Signed in as <strong><bdi>bob</bdi></strong>" in (await browser.get("/inbox")).text


async def test_signing_out_ends_the_session(world: World) -> None:
    bob = await world.signed_in()
    kept = dict(bob.cookies)
    inbox = await bob.get("/inbox")
    out = await bob.post("/sign-out", {"csrf": inbox.hidden("csrf")})
    assert (out.status, out.location) == (303, "/sign-in") and "toolbooth-session" not in bob.cookies
    bob.cookies.update(kept)  # the old cookie, sent again
    assert (await bob.get("/inbox")).location == "/sign-in"


async def test_every_response_has_the_strict_headers_and_a_foreign_host_is_refused(world: World) -> None:
    browser = world.browser()
    for path in ("/", "/sign-in", "/inbox", "/static/inbox.css", "/no-such-page"):
        strict(await browser.get(path))
    css, script = await browser.get("/static/inbox.css"), await browser.get("/static/live.js")
    assert css.status == 200 and css.headers["Content-Type"].startswith("text/css")
    assert script.status == 200 and "javascript" in script.headers["Content-Type"] and "EventSource" in script.text
    assert "dataset.reload" in script.text and "30000" not in script.text  # the server says how often it polls
    rebound = await browser.get("/sign-in", headers={"Host": "evil.example:80"})
    assert rebound.status == 421
    strict(rebound)
    big = await browser.post("/sign-in", {"csrf": "x", "token": "a" * 70_000})
    assert big.status == 413


async def test_the_inbox_filters_by_tool_and_requester(world: World) -> None:
    previews = [await world.held_note(key=f"k-{n}") for n in range(3)]
    draft = await world.client().execute("send_email_preview", MAIL)
    await world.client().execute("send_email", {"preview_id": draft.data["preview_id"]}, idempotency_key="m-1")
    bob = await world.signed_in()
    notes = await bob.get("/inbox?tool=file_note")
    assert "3 pending" in notes.text and all(p.preview_id in notes.text for p in previews)
    assert (await bob.get("/inbox?requester=nobody")).text.count("/previews/") == 0
    everything = await bob.get("/inbox")
    assert "4 pending" in everything.text and '<meta http-equiv="refresh" content="30">' in everything.text
    assert f'data-reload="{RETRY_AFTER_SECONDS}"' in everything.text  # live.js polls so once it has no stream


async def test_the_newest_inbox_page_lists_the_pending_previews_once(world: World, monkeypatch: pytest.MonkeyPatch,
                                                                      ) -> None:
    """The newest page is the head of the listing the inbox reads for its live version: one listing, not two."""
    held = [await world.held_note(key=f"k-{n}") for n in range(3)]
    bob = await world.signed_in()
    listings: list[PreviewQuery] = []
    read = world.store.previews

    async def counted(query: PreviewQuery) -> list[PreviewRecord]:
        listings.append(query)
        return await read(query)

    monkeypatch.setattr(world.store, "previews", counted)
    inbox = await bob.get("/inbox")
    assert "3 pending" in inbox.text and all(p.preview_id in inbox.text for p in held)
    assert len([q for q in listings if q.expires_by == math.inf]) == 1  # the pending ones (the rest: expired)


async def test_the_inbox_filters_by_a_requester_whose_id_holds_a_bracket(world: World) -> None:
    """A requester id is filtered on as it is, never read back out of the text shown ("ops (eu) (acme)")."""
    held = await world.client("ops (eu)").execute("file_note", NOTE, idempotency_key="k-1")
    assert held.preview is not None
    other = await world.held_note(key="k-2")
    bob = await world.signed_in()
    inbox = await bob.get("/inbox")
    assert '<option value="ops (eu)">ops (eu)</option>' in inbox.text
    theirs = await bob.get("/inbox?" + urlencode({"requester": "ops (eu)"}))
    assert "1 pending" in theirs.text and held.preview.preview_id in theirs.text
    assert other.preview_id not in theirs.text
    assert "Nothing is waiting" in (await bob.get("/inbox?requester=ops")).text


async def test_a_port_in_use_is_a_start_up_error_naming_the_setting(make_settings: Callable[..., Settings],
                                                                    make_token: Callable[..., str],
                                                                    tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as raised:
            async with served_inbox(make_settings(approvals_ui={"listen": f"127.0.0.1:{port}"}), make_token, tmp_path):
                pass
    assert str(raised.value) == f"cannot listen on approvals_ui.listen 127.0.0.1:{port}: the port is in use " \
                                "(another process is listening there)"


@pytest.mark.parametrize("ui", [{"page_size": 2}])
async def test_the_inbox_pages_newest_first(world: World) -> None:
    held = [await world.held_note(key=f"k-{n}") for n in range(3)]
    await world.store.driver.execute("UPDATE previews SET created_at = created_at - 60 WHERE preview_id = ?",
                                     (held[0].preview_id,))  # the oldest, clearly
    bob = await world.signed_in()
    first = await bob.get("/inbox")
    assert "3 pending" in first.text and 'rel="first"' not in first.text
    assert first.text.count("/previews/") == 2 * 2 and held[0].preview_id not in first.text  # two links each
    older = re.search(r'<a href="([^"]+)" rel="next">Older</a>', first.text)
    assert older is not None
    second = await bob.get(html.unescape(older[1]))
    assert held[0].preview_id in second.text and second.text.count("/previews/") == 2
    assert 'rel="first"' in second.text and 'rel="next"' not in second.text
    forged = await bob.get("/inbox?tool=file_note&after=p1.not-a-token")  # a link no page gave: the newest
    assert (forged.status, forged.location) == (303, "/inbox?tool=file_note")


async def test_serve_runs_the_inbox_in_dev_mode_on_loopback(
    make_settings: Callable[..., Settings], socket_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from sidecar.bootstrap import serve

    caplog.set_level(logging.INFO, logger="sidecar.server.approvals_ui.endpoint")
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]}, approvals_ui={"listen": "127.0.0.1:0"})
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop))
    browser: Browser | None = None
    try:
        await until(lambda: task.done() or "approval inbox listening on" in caplog.text, what="the inbox listening")
        browser = Browser(caplog.text.split("approval inbox listening on ")[1].split()[0])
        form = await browser.get("/sign-in")
        assert "Continue as the development principal" in form.text and 'name="token"' not in form.text
        assert (await browser.sign_in()).location == "/inbox"
        assert "Signed in as <strong><bdi>dev</bdi></strong>" in (await browser.get("/inbox")).text
    finally:
        if browser is not None:
            await browser.close()
        stop.set()
        async with asyncio.timeout(30):
            await task
