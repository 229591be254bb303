"""Live updates of the approval inbox through a real sidecar: the server-sent events of ``/inbox/events``.

An approver's open stream says ``changed`` when a preview they may decide arrives, is decided elsewhere or
expires; an approver who may not decide it (its requester) hears nothing of it; the stream needs the session,
ends with it, and every open stream ends when the sidecar stops, without holding the shutdown up.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.config import Settings
from sidecar.contract import Principal
from sidecar.errors import StoreUnavailableError
from sidecar.server.approvals_ui import live
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.inbox import Browser, World, served_inbox
from tests.support.waiting import past, until

pytestmark = pytest.mark.integration

BOB = Principal(id="bob", tenant="acme")
_SINCE = re.compile(r'data-live="/inbox/events\?since=([0-9a-f]{20})"')


@pytest.fixture
def approval() -> dict[str, Any]:
    return {}


@pytest.fixture
def ui() -> dict[str, Any]:
    return {}


@pytest.fixture
async def world(tmp_path: Path, make_settings: Callable[..., Settings], jwt_auth: dict[str, Any],
                make_token: Callable[..., str], approval: dict[str, Any], ui: dict[str, Any]) -> AsyncIterator[World]:
    settings = make_settings(auth=jwt_auth, approvals_ui={"listen": "127.0.0.1:0", "live_seconds": 0.2, **ui})
    async with served_inbox(settings, make_token, tmp_path, **approval) as world:
        yield world


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every quiet round of a stream sends its heartbeat, so a test can count the rounds a stream made."""
    monkeypatch.setattr(live, "HEARTBEAT_SECONDS", 0.0)


class Stream:
    """One open ``/inbox/events`` stream of a browser, read in the background: its events and heartbeats, and
    its body as text."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response, self.events, self.heartbeats, self.ended = response, list[tuple[str, str]](), 0, False
        self.body = ""
        self._task = asyncio.create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def of(cls, browser: Browser, since: str = "") -> AsyncIterator[Stream]:
        cookie = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())
        async with aiohttp.ClientSession() as http, http.get(
                f"{browser.url}/inbox/events?since={since}", headers={"Cookie": cookie},
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as response:
            stream = cls(response)
            try:
                yield stream
            finally:
                stream._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream._task

    def named(self, name: str) -> list[str]:
        return [data for event, data in self.events if event == name]

    async def _read(self) -> None:
        event = ""
        with contextlib.suppress(aiohttp.ClientPayloadError):
            async for raw in self.response.content:
                self.body += raw.decode()
                line = raw.decode().rstrip("\n")
                if line.startswith(": "):
                    self.heartbeats += 1
                elif line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event:
                    self.events.append((event, line.removeprefix("data: ")))
                    event = ""
        self.ended = True


async def since(browser: Browser) -> str:
    """The version of the previews the browser's inbox page was rendered with."""
    page = await browser.get("/inbox")
    found = _SINCE.search(page.text)
    assert found, page.text
    return found[1]


async def test_a_stream_needs_a_session(world: World) -> None:
    stranger = world.browser()
    answer = await stranger.get("/inbox/events")
    assert answer.status == 401 and answer.headers["Content-Type"].startswith("text/plain")


async def test_an_arriving_preview_is_told_to_its_approver_and_to_nobody_else(world: World, rounds: None) -> None:
    bob, alice = await world.signed_in(), await world.signed_in("alice", ("approver",))  # the requester
    bob_since, alice_since = await since(bob), await since(alice)
    async with Stream.of(bob, bob_since) as bobs, Stream.of(alice, alice_since) as alices:
        assert bobs.response.status == 200 and bobs.response.headers["Content-Type"].startswith("text/event-stream")
        await until(lambda: alices.heartbeats >= 1, what="alice's stream running")
        preview = await world.held_note()
        await until(lambda: len(bobs.named("changed")) == 1, what="bob told of the new preview")
        assert bobs.named("changed") == [await since(bob)]  # the version his inbox now shows
        seen = alices.heartbeats
        await until(lambda: alices.heartbeats >= seen + 2, what="alice's stream looking twice more")
        assert alices.events == [] and await since(alice) == alice_since  # she may not decide it: nothing changed
        assert preview.preview_id not in str(bobs.events)  # an event carries a version, never a preview


async def test_a_preview_decided_elsewhere_or_expired_is_told(world: World) -> None:
    decided, expiring = await world.held_note("k-1"), await world.held_note("k-2")
    bob, dave = await world.signed_in(), await world.signed_in("dave", ("approver",))
    async with Stream.of(bob, await since(bob)) as bobs:
        csrf = (await dave.get("/inbox")).hidden("csrf")
        denied = await dave.post(f"/previews/{decided.preview_id}/deny", {"csrf": csrf, "reason": "not now"})
        assert denied.status == 200
        await until(lambda: len(bobs.named("changed")) == 1, what="bob told of dave's decision")
        page = await bob.get(f"/previews/{decided.preview_id}")  # what bob's open page of it now fetches
        assert page.status == 200 and 'data-state="denied"' in page.text and "Decided by <bdi>dave</bdi>" in page.text
        assert "/deny" not in page.text and "“<bdi>not now</bdi>”" in page.text
        alice = await world.signed_in("alice", ("approver",))
        assert (await alice.get(f"/previews/{decided.preview_id}")).status == 404  # her own call, decided or not
        await world.store.driver.execute("UPDATE previews SET expires_at = ? WHERE preview_id = ?",
                                         (time.time() - 1, expiring.preview_id))
        await until(lambda: len(bobs.named("changed")) == 2, what="bob told of the expiry")
        assert bobs.named("changed")[-1] == await since(bob)


@pytest.mark.parametrize("approval", [{"preview_ttl_seconds": 2}])
async def test_a_preview_expiring_on_its_own_is_told(world: World) -> None:
    preview = await world.held_note()
    bob = await world.signed_in()
    async with Stream.of(bob, await since(bob)) as bobs:
        await past(calendar.timegm(time.strptime(preview.expires_at, "%Y-%m-%dT%H:%M:%SZ")))
        await until(lambda: len(bobs.named("changed")) == 1, what="bob told of the expiry")
        assert "Expired before anyone decided" in (await bob.get("/inbox")).text


async def test_a_stale_or_malformed_since_is_answered_with_the_current_version(world: World) -> None:
    await world.held_note()
    bob = await world.signed_in()
    for given in ("", "0" * 20, "<script>alert(1)</script>", "f" * 5000):
        async with Stream.of(bob, given) as bobs:
            await until(lambda: len(bobs.named("changed")) == 1, what=f"the current version for since={given[:9]}")
            assert bobs.named("changed") == [await since(bob)]


async def test_a_stream_ends_when_its_session_does(world: World) -> None:
    bob = await world.signed_in()
    async with Stream.of(bob, await since(bob)) as bobs:
        out = await bob.post("/sign-out", {"csrf": (await bob.get("/inbox")).hidden("csrf")})
        assert out.status == 303
        await until(lambda: bobs.ended, what="the stream ending")
        assert bobs.named("signed-out") == [""]


async def test_a_principals_streams_are_bounded_across_their_sessions(world: World) -> None:
    bob, again = await world.signed_in(), await world.signed_in()  # two sessions (browsers) of one principal
    async with contextlib.AsyncExitStack() as held:
        opened = [await held.enter_async_context(Stream.of(browser)) for browser in (bob, again, bob, again, bob)]
        assert [s.response.status for s in opened] == [200] * 5
        await until(lambda: opened[0].ended, what="bob's oldest stream ended by his fifth")
        assert opened[0].named("superseded") == [""] and not any(s.ended for s in opened[1:])
        assert world.inbox.inbox.live.slots.held(BOB) == 4  # approvals_ui.max_streams_per_principal
        at_once = await asyncio.gather(*(held.enter_async_context(Stream.of(again)) for _ in range(6)))
        assert [s.response.status for s in at_once] == [200] * 6 and world.inbox.inbox.live.slots.held(BOB) == 4
        await until(lambda: sum(not s.ended for s in opened + at_once) == 4, what="only bob's newest 4 streaming")
        dave = await world.signed_in("dave", ("approver",))  # another principal keeps his own
        async with Stream.of(dave) as daves:
            await until(lambda: bool(daves.events), what="dave's stream running")
            assert daves.response.status == 200 and not daves.ended
    await until(lambda: world.inbox.inbox.live.open_streams == 0, what="closed streams no longer counted")


@pytest.mark.parametrize("ui", [{"http": {"max_connections": 64}}])
async def test_two_approvers_holding_every_stream_they_can_leave_room_for_a_third(world: World) -> None:
    streams: dict[str, list[Stream]] = {"bob": [], "carol": []}
    most: dict[str, int] = {"bob": 0, "carol": 0}  # the most streams the inbox held of each, at any moment
    async with contextlib.AsyncExitStack() as held:
        for who, theirs in streams.items():  # every session they may hold, each with 8 pages opening at once
            for _ in range(10):
                with contextlib.suppress(AssertionError, aiohttp.ClientError):
                    browser = await world.signed_in(who, ("approver",))
                    opened = await asyncio.gather(*(held.enter_async_context(Stream.of(browser)) for _ in range(8)),
                                                  return_exceptions=True)
                    theirs += [s for s in opened if isinstance(s, Stream) and s.response.status == 200]
                most[who] = max(most[who], world.inbox.inbox.live.slots.held(Principal(id=who, tenant="acme")))
        erin = await world.signed_in("erin", ("approver",))
        async with Stream.of(erin) as erins:
            assert erins.response.status == 200
            await until(lambda: bool(erins.events), what="erin's stream running")
        for who, theirs in streams.items():
            await until(lambda mine=theirs: sum(not s.ended for s in mine) == 4, what=f"{who}'s newest 4 only")
            assert all(s.named("superseded") == [""] for s in theirs if s.ended)
    assert most == {"bob": 4, "carol": 4}  # approvals_ui.max_streams_per_principal, even opening 8 at once


@pytest.mark.parametrize("ui", [{"max_streams": 2, "max_streams_per_principal": 1, "http": {"max_connections": 8}}])
async def test_a_stream_past_the_cap_of_all_is_refused_with_retry_after(world: World) -> None:
    bob, dave, erin = [await world.signed_in(who, ("approver",)) for who in ("bob", "dave", "erin")]
    async with contextlib.AsyncExitStack() as held:
        bobs = await held.enter_async_context(Stream.of(bob))
        async with Stream.of(dave) as daves:
            assert (bobs.response.status, daves.response.status) == (200, 200)
            async with Stream.of(erin) as refused:
                assert refused.response.status == 503
                assert refused.response.headers["Retry-After"] == str(live.RETRY_AFTER_SECONDS)
                await until(lambda: refused.ended, what="the refusal read")
                assert refused.body == "The inbox holds as many live pages as it may; this page reloads on its own."
            assert (await erin.get("/inbox")).status == 200  # her pages still load; only live updates wait
            bobs_newer = await held.enter_async_context(Stream.of(bob))  # bob's newer page takes his own place
            await until(lambda: bobs.ended, what="bob's older stream superseded")
            assert bobs_newer.response.status == 200 and not daves.ended
        await until(lambda: world.inbox.inbox.live.open_streams == 1, what="dave's stream given back")
        async with Stream.of(erin) as erins:
            assert erins.response.status == 200


async def test_a_failing_store_skips_a_round_and_the_stream_goes_on(world: World, rounds: None,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    bob = await world.signed_in()
    async with Stream.of(bob, await since(bob)) as bobs:
        async def down(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError("database is locked (secret detail)")

        monkeypatch.setattr(world.store, "previews", down)
        await until(lambda: "live update for bob skipped" in caplog.text, what="a skipped round")
        monkeypatch.undo()
        await world.held_note()
        await until(lambda: len(bobs.named("changed")) == 1, what="bob told once the store is back")
        assert not bobs.ended and "secret detail" not in str(bobs.events)


async def test_stopping_the_sidecar_ends_every_open_stream_at_once(
    make_settings: Callable[..., Settings], socket_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from sidecar.bootstrap import serve

    caplog.set_level(logging.INFO)
    settings = make_settings(server={"listen": [f"unix://{socket_path}"]}, approvals_ui={"listen": "127.0.0.1:0"})
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop))
    browser: Browser | None = None
    try:
        await until(lambda: task.done() or "approval inbox listening on" in caplog.text, what="the inbox listening")
        browser = Browser(caplog.text.split("approval inbox listening on ")[1].split()[0])
        assert (await browser.sign_in()).location == "/inbox"
        async with Stream.of(browser) as first, Stream.of(browser) as second:
            await until(lambda: bool(first.events and second.events), what="both streams open")
            stop.set()
            async with asyncio.timeout(30):
                await task
            await until(lambda: first.ended and second.ended, what="the streams ended")
    finally:
        if browser is not None:
            await browser.close()
        stop.set()
        async with asyncio.timeout(30):
            await task
    # The streams ended on their own: uvicorn neither waited for them nor cancelled them at its grace period.
    assert "Waiting for connections to close" not in caplog.text, caplog.text
    assert "timeout graceful shutdown exceeded" not in caplog.text, caplog.text
