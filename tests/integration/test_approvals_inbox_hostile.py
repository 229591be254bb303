"""The approval inbox under attack, through a real sidecar and a real HTTP client.

Sign-ins cannot push an approver out: only approvers get sessions, one principal's sign-ins end only their own
oldest session, and a full inbox refuses the newcomer. Bidirectional and invisible characters in a held call
are shown marked and isolated (in the inbox, the preview's page and ``toolbooth previews list --long``), for
tools with and without a rendering. A malformed reason or comment gets the message the RPC gives; a form that
is not UTF-8 changes nothing; a token whose ``exp`` is a string signs nobody in.
"""

from __future__ import annotations

import asyncio
import html
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.config import Settings
from sidecar.contract import Preview, PreviewState, Status
from sidecar.server.approvals_ui.pages import FULL
from tests.support.approvals import NOTE
from tests.support.inbox import MAIL, Page, World, served_inbox

pytestmark = pytest.mark.integration

HIDDEN = "pay \u202e9876\u202c, not 10\u200b0"  # obeyed, it reads "pay 6789, not 100"
MARKED = "pay ⟦U+202E⟧9876⟦U+202C⟧, not 10⟦U+200B⟧0"
RAW = ("\u202e", "\u202c", "\u200b")


@pytest.fixture
def ui() -> dict[str, Any]:
    return {}


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str], ui: dict[str, Any]) -> AsyncIterator[World]:
    settings = make_settings(auth=jwt_auth, approvals_ui={"listen": "127.0.0.1:0", **ui})
    async with served_inbox(settings, make_token, tmp_path) as world:
        yield world


def seen(page: Page) -> str:
    """The page's text as a person reads it: tags dropped, entities read."""
    text = page.text
    while "<" in text:
        start = text.index("<")
        text = text[:start] + text[text.index(">", start) + 1:]
    return html.unescape(text)


# --- sign-ins


async def test_a_flood_of_sign_ins_without_the_role_opens_no_session_and_ends_none(world: World) -> None:
    bob = await world.signed_in()
    token = world.tokens(sub="carol", roles=["developer"])
    carol = world.browser()
    for _ in range(40):
        page = await carol.sign_in(token)
        assert page.status == 403 and "toolbooth-session" not in page.set_cookies, page.text
    assert "carol holds none of the roles that may approve calls here (approver)" in page.text
    assert "nothing here for them to approve or deny: nobody was signed in" in page.text
    assert (await carol.get("/inbox")).location == "/sign-in"
    assert (await bob.get("/inbox")).status == 200  # the approver is still signed in


async def test_an_operator_signs_in_without_the_approver_role(world: World) -> None:
    await world.signed_in("olga", ("operator",))


@pytest.mark.parametrize("ui", [{"max_sessions": 4, "max_sessions_per_principal": 2}])
async def test_ones_sign_ins_end_only_ones_own_sessions_and_a_full_inbox_refuses_newcomers(world: World) -> None:
    bob = await world.signed_in()
    daves = [await world.signed_in("dave", ("approver",)) for _ in range(12)]
    assert [(await dave.get("/inbox")).status for dave in daves[-2:]] == [200, 200]  # his two newest
    assert [(await dave.get("/inbox")).location for dave in daves[:-2]] == ["/sign-in"] * 10
    assert (await bob.get("/inbox")).status == 200
    erin = await world.signed_in("erin", ("approver",))  # the fourth session: the inbox is full
    frank = world.browser()
    refused = await frank.sign_in(world.tokens(sub="frank", roles=["approver"]))
    assert refused.status == 503 and FULL in html.unescape(refused.text)
    assert "toolbooth-session" not in refused.set_cookies
    again = await world.signed_in("erin", ("approver",))  # erin, holding one, gives up her own
    assert (await erin.get("/inbox")).location == "/sign-in" and (await again.get("/inbox")).status == 200
    assert (await bob.get("/inbox")).status == 200 and (await daves[-1].get("/inbox")).status == 200


async def test_a_token_whose_expiry_is_a_string_signs_nobody_in(world: World) -> None:
    browser = world.browser()
    for claims in ({"exp": str(int(time.time()) + 300)}, {"nbf": "0"}, {"iat": True}):
        page = await browser.sign_in(world.tokens(sub="bob", roles=["approver"], **claims))
        assert page.status == 401 and f"Not signed in: invalid token claim {next(iter(claims))}." in page.text
        assert "toolbooth-session" not in page.set_cookies
    assert (await browser.sign_in(world.tokens(sub="bob", roles=["approver"], exp=10**400))).status == 303


# --- what the approver sees


async def held_hidden(world: World) -> tuple[Preview, Preview]:
    """A note (no rendering: its arguments are shown) and an email (rendered), each holding ``HIDDEN``."""
    note = await world.client().execute("file_note", {**NOTE, "title": HIDDEN}, idempotency_key="k-1",
                                        conversation_id="conv\u202e-7")
    draft = await world.client().execute("send_email_preview", {**MAIL, "subject": HIDDEN})
    mail = await world.client().execute("send_email", {"preview_id": draft.data["preview_id"]}, idempotency_key="m-1")
    assert note.preview is not None and mail.preview is not None, (note, mail)
    return note.preview, mail.preview


async def test_hidden_characters_are_marked_and_isolated_in_every_page(world: World) -> None:
    note, mail = await held_hidden(world)
    bob = await world.signed_in()
    inbox = await bob.get("/inbox")
    assert "conv⟦U+202E⟧-7" in seen(inbox) and not any(char in inbox.text for char in RAW)
    for preview in (note, mail):
        detail = await bob.get(f"/previews/{preview.preview_id}")
        assert detail.status == 200 and MARKED in seen(detail), seen(detail)
        assert not any(char in detail.text for char in RAW)
        assert '<span class="mark" title="a character that would not be seen, shown by its code point">⟦U+202E⟧' \
               "</span>9876" in detail.text
        assert '<bdi>pay <span class="mark"' in detail.text  # the value isolated
    css = await bob.get("/static/inbox.css")
    assert "bdi { unicode-bidi: isolate; }" in css.text and ".mark {" in css.text
    csrf = detail.hidden("csrf")
    denied = await bob.post(f"/previews/{mail.preview_id}/deny", {"csrf": csrf, "reason": "not \u202e1 2\u202c"})
    assert denied.status == 200 and "not ⟦U+202E⟧1 2⟦U+202C⟧" in seen(denied)
    history = await bob.get("/history")
    assert "not ⟦U+202E⟧1 2⟦U+202C⟧" in seen(history) and not any(char in history.text for char in RAW)


async def test_the_command_line_marks_hidden_characters(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    note, mail = await held_hidden(world)
    bob = ["--target", world.target, "--token", world.tokens(sub="bob", roles=["approver"])]
    code = await asyncio.to_thread(main, ["previews", "list", "--long", *bob])
    out = capsys.readouterr().out
    assert code == 0 and note.preview_id in out and mail.preview_id in out
    assert f'"title":"{MARKED}"' in out  # the call's arguments
    assert f'"subject": "{MARKED}"' in out  # the tool's rendering
    assert not any(char in out for char in RAW)
    code = await asyncio.to_thread(main, ["previews", "list", *bob])
    out = capsys.readouterr().out
    assert code == 0 and not any(char in out for char in RAW)


# --- forms


async def test_a_malformed_reason_or_comment_gets_the_rpcs_own_message(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    csrf = (await bob.get(f"/previews/{preview.preview_id}")).hidden("csrf")
    rpc = world.client("bob", ("approver",))
    for reason in ("a\x00b", "x" * 5000, " "):
        said = (await rpc.deny(preview.preview_id, reason=reason)).error
        assert said is not None
        page = await bob.post(f"/previews/{preview.preview_id}/deny", {"csrf": csrf, "reason": reason})
        assert page.status == 400 and f"Nothing was denied: {said.message}." in html.unescape(page.text), page.text
    said = (await rpc.approve(preview.preview_id, preview.preview_hash, comment="ok\x00")).error
    assert said is not None and said.field == "comment"
    page = await bob.post(f"/previews/{preview.preview_id}/approve",
                          {"csrf": csrf, "preview_hash": preview.preview_hash, "comment": "ok\x00"})
    assert page.status == 400 and f"Nothing was approved: {said.message}." in html.unescape(page.text)
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]


async def test_a_form_that_is_not_utf8_changes_nothing(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    csrf = (await bob.get(f"/previews/{preview.preview_id}")).hidden("csrf")
    approve = f"csrf={csrf}&preview_hash={preview.preview_hash}&comment=caf%E9".encode()
    deny = f"csrf={csrf}&reason=%FF%FE".encode()
    surrogate = f"csrf={csrf}&reason=%ED%A0%80".encode()
    for action, body in (("approve", approve), ("deny", deny), ("deny", surrogate)):
        page = await bob.post_raw(f"/previews/{preview.preview_id}/{action}", body)
        assert page.status == 400 and "a form must be UTF-8" in page.text and "nothing changed" in page.text
    assert [p.state for p in await world.pending()] == [PreviewState.PENDING]
    await world.store.flush_audit()
    assert not [e for e in await world.store.audit_events() if "approver" in json.loads(e.decisions_json)]
    ok = await bob.post_raw(f"/previews/{preview.preview_id}/approve",
                            f"csrf={csrf}&preview_hash={preview.preview_hash}&comment=caf%C3%A9".encode())
    assert ok.status == 200 and "café" in ok.text
    ran = await world.client().execute("file_note", NOTE, idempotency_key="k-2", approval_id=preview.preview_id)
    assert ran.status is Status.SUCCESS
