"""``auth.jwt.jwks_url``: tokens verified with the issuer's published keys, fetched from a real local server.

The set is cached, fetched again for a ``kid`` it lacks at most once per ``jwks_min_refresh_seconds``, and
never used past ``jwks_cache_seconds``; a server that is down, slow or answers nonsense fails closed
(UNAUTHENTICATED), is not asked again within ``jwks_min_refresh_seconds``, and never blocks the event loop.
A server that drips its answer is cut off at ``jwks_timeout_seconds`` (the whole fetch), and a sidecar stopped
during such a fetch exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.client import AsyncClient, ClientError
from sidecar.config import AuthSettings, Settings
from sidecar.errors import AuthenticationError
from sidecar.server.auth import Authenticator
from sidecar.server.jwks import KEYS_UNAVAILABLE
from tests.integration.conftest import AUDIENCE, ISSUER, StartSidecar
from tests.integration.test_server import FakeGateway
from tests.support.jwks_server import JwksServer, SigningKey, jwks_server
from tests.support.sidecar_process import SidecarProcess
from tests.support.waiting import until

pytestmark = pytest.mark.integration

DRIP = 0.25  # seconds between two bytes of a dripping answer: far within a 1 s read timeout
# A call's own deadline: far beyond a 1 s fetch timeout, even on a loaded machine, so a call that ends before it
# was ended by the fetch's bound.
CALL_DEADLINE = 20.0


@pytest.fixture(scope="module")
def first() -> SigningKey:
    return SigningKey("key-1")


@pytest.fixture(scope="module")
def second() -> SigningKey:
    return SigningKey("key-2")


@pytest.fixture
def jwks(first: SigningKey) -> Iterator[JwksServer]:
    with jwks_server() as server:
        server.keys = [first]
        yield server


def _auth(url: str, **jwt: Any) -> dict[str, Any]:
    return {"mode": "jwt", "jwt": {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": url, "leeway_seconds": 0,
                                   **jwt}}


def _authenticator(url: str, **jwt: Any) -> Authenticator:
    return Authenticator(AuthSettings.model_validate(_auth(url, **jwt)))


def _claims() -> dict[str, Any]:
    return {"sub": "user-1", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300, "tenant": "acme"}


def _bearer(token: str) -> list[tuple[str, str | bytes]]:
    return [("authorization", f"Bearer {token}")]


async def _refused(authenticator: Authenticator, token: str) -> str:
    with pytest.raises(AuthenticationError) as caught:
        await authenticator.authenticate(_bearer(token))
    return str(caught.value)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_token_signed_by_a_key_of_the_set_is_accepted_and_the_set_is_fetched_once(
        jwks: JwksServer, first: SigningKey) -> None:
    authenticator = _authenticator(jwks.url)
    for _ in range(5):
        assert (await authenticator.authenticate(_bearer(first.sign(_claims())))).id == "user-1"
    assert jwks.fetches == 1
    assert jwks.agents[0].startswith("toolbooth/")


async def test_a_key_added_by_a_rotation_is_accepted_once_the_cooldown_allows_a_refresh(
        jwks: JwksServer, first: SigningKey, second: SigningKey) -> None:
    authenticator = _authenticator(jwks.url, jwks_min_refresh_seconds=0.3)
    assert (await authenticator.authenticate(_bearer(first.sign(_claims())))).id == "user-1"
    jwks.keys = [first, second]  # the issuer publishes its next key, then signs with it

    async def accepted() -> bool:
        try:
            await authenticator.authenticate(_bearer(second.sign(_claims())))
        except AuthenticationError as exc:
            assert str(exc) == "invalid token"  # within the cooldown: refused without a fetch
            return False
        return True

    await until(accepted, what="the new key's token accepted")
    assert jwks.fetches == 2
    assert (await authenticator.authenticate(_bearer(first.sign(_claims())))).id == "user-1"  # the old one too


async def test_an_unknown_kid_is_refused_without_hammering_the_server(jwks: JwksServer, first: SigningKey) -> None:
    authenticator = _authenticator(jwks.url, jwks_min_refresh_seconds=60)
    assert (await authenticator.authenticate(_bearer(first.sign(_claims())))).id == "user-1"
    stranger = SigningKey("stranger")
    refusals = await asyncio.gather(*(_refused(authenticator, stranger.sign(_claims())) for _ in range(50)))
    assert set(refusals) == {"invalid token"}
    assert jwks.fetches == 1  # the cooldown of the first fetch covers every one of them


async def test_a_token_that_could_never_verify_fetches_nothing(jwks: JwksServer, first: SigningKey) -> None:
    authenticator = _authenticator(jwks.url)
    rs384 = first.sign(_claims(), algorithm="RS384")  # RS384 is not among auth.jwt.algorithms
    assert await _refused(authenticator, rs384) == "invalid token"
    no_kid = SigningKey("")
    assert await _refused(authenticator, no_kid.sign(_claims())) == "invalid token"
    assert await _refused(authenticator, "not.a.jwt") == "invalid token"
    assert jwks.fetches == 0


async def test_the_key_decides_the_algorithm(jwks: JwksServer, first: SigningKey) -> None:
    """A JWK with ``alg: RS256`` never verifies a PS256 token, though both algorithms are allowed."""
    authenticator = _authenticator(jwks.url, algorithms=["RS256", "PS256"])
    assert await _refused(authenticator, first.sign(_claims(), algorithm="PS256")) == "invalid token"
    assert (await authenticator.authenticate(_bearer(first.sign(_claims())))).id == "user-1"


async def test_a_server_that_is_down_fails_closed_and_is_asked_again_only_after_the_cooldown(
        first: SigningKey) -> None:
    with jwks_server() as jwks:
        jwks.keys, jwks.status, jwks.body = [first], 503, b"unavailable"
        authenticator = _authenticator(jwks.url, jwks_min_refresh_seconds=0.3)
        refusals = await asyncio.gather(*(_refused(authenticator, first.sign(_claims())) for _ in range(20)))
        assert set(refusals) == {KEYS_UNAVAILABLE}
        assert jwks.fetches == 1
        jwks.status, jwks.body = 200, None  # back

        async def accepted() -> bool:
            try:
                await authenticator.authenticate(_bearer(first.sign(_claims())))
            except AuthenticationError as exc:
                assert str(exc) == KEYS_UNAVAILABLE
                return False
            return True

        await until(accepted, what="a token accepted once the server is back")
        assert jwks.fetches == 2


@pytest.mark.parametrize("body", [b"<html>not json</html>", b"[1, 2]", b'{"keys": []}', b'{"keys": [{"kty": "nope"}]}'])
async def test_an_answer_that_is_not_a_key_set_fails_closed(first: SigningKey, body: bytes) -> None:
    with jwks_server() as jwks:
        jwks.body = body
        assert await _refused(_authenticator(jwks.url), first.sign(_claims())) == KEYS_UNAVAILABLE


async def test_nothing_listening_fails_closed(first: SigningKey) -> None:
    authenticator = _authenticator(f"http://127.0.0.1:{_closed_port()}/jwks.json")
    assert await _refused(authenticator, first.sign(_claims())) == KEYS_UNAVAILABLE


async def test_a_slow_server_times_out_without_blocking_the_event_loop(first: SigningKey) -> None:
    with jwks_server() as jwks:
        jwks.keys, jwks.hold = [first], threading.Event()
        authenticator = _authenticator(jwks.url, jwks_timeout_seconds=0.5)
        started = time.monotonic()
        calls = asyncio.gather(*(_refused(authenticator, first.sign(_claims())) for _ in range(5)))
        # The loop goes on while the fetch waits: this test's own coroutine sees the fetch arrive and the
        # calls still waiting (a fetch that blocked the loop would have ended, and refused them all, first).
        await until(lambda: jwks.fetches == 1, what="the key set's fetch")
        assert not calls.done()
        refusals = await calls
        elapsed = time.monotonic() - started
        assert set(refusals) == {KEYS_UNAVAILABLE}
        assert jwks.fetches == 1  # the others waited for that one, then were refused without a fetch
        assert elapsed >= 0.5


async def test_a_set_older_than_its_cache_time_is_not_used(jwks: JwksServer, first: SigningKey) -> None:
    authenticator = _authenticator(jwks.url, jwks_cache_seconds=0.2, jwks_min_refresh_seconds=0)
    assert (await authenticator.authenticate(_bearer(first.sign(_claims())))).id == "user-1"
    jwks.status, jwks.body = 503, b"down"

    async def refused() -> bool:
        try:
            await authenticator.authenticate(_bearer(first.sign(_claims())))
        except AuthenticationError as exc:
            return str(exc) == KEYS_UNAVAILABLE
        return False

    await until(refused, what="the expired set no longer used")


async def test_a_sidecar_verifies_with_the_jwks_and_refuses_as_unauthenticated_when_it_is_down(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, jwks: JwksServer,
        first: SigningKey) -> None:
    sidecar = await start_sidecar(make_settings(auth=_auth(jwks.url)), FakeGateway())
    async with AsyncClient(sidecar.addresses[0], token=first.sign(_claims()), timeout=5) as client:
        assert (await client.list_tools()).policy_revision == "rev-1"
    down_auth = _auth(f"http://127.0.0.1:{_closed_port()}/jwks.json")
    down = await start_sidecar(make_settings(server={"listen": ["127.0.0.1:0"]}, auth=down_auth), FakeGateway())
    async with AsyncClient(down.addresses[0], token=first.sign(_claims()), timeout=5) as client:
        with pytest.raises(ClientError) as caught:
            await client.list_tools()
    assert (caught.value.code, caught.value.details) == (grpc.StatusCode.UNAUTHENTICATED, KEYS_UNAVAILABLE)


async def test_a_dripping_server_is_cut_off_at_the_timeout_and_once_it_recovers_serves_the_next_call(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, jwks: JwksServer,
        first: SigningKey) -> None:
    jwks.drip = DRIP
    auth = _auth(jwks.url, jwks_timeout_seconds=1, jwks_min_refresh_seconds=0)
    sidecar = await start_sidecar(make_settings(auth=auth), FakeGateway())
    async with AsyncClient(sidecar.addresses[0], token=first.sign(_claims()), timeout=CALL_DEADLINE) as client:

        async def status() -> tuple[grpc.StatusCode, str]:
            with pytest.raises(ClientError) as caught:
                await client.list_tools()
            return caught.value.code, caught.value.details

        started = time.monotonic()
        statuses = await asyncio.gather(*(status() for _ in range(5)))
        assert set(statuses) == {(grpc.StatusCode.UNAUTHENTICATED, KEYS_UNAVAILABLE)}
        assert time.monotonic() - started >= 1  # the fetch had its whole second
        assert jwks.fetches == 1  # the calls waited for that one fetch
        jwks.drip = None  # the server recovers (the cut-off answer drips on)
        assert (await client.list_tools()).policy_revision == "rev-1"


async def test_a_sidecar_stopped_during_a_dripping_fetch_exits(tmp_path: Path, jwks: JwksServer,
                                                                first: SigningKey) -> None:
    """SIGTERM ends the fetch, though its timeout (60 s) is far off: the process exits."""
    jwks.drip = DRIP
    socket_path, config = tmp_path / "tb.sock", tmp_path / "config.json"
    config.write_text(json.dumps({
        "server": {"listen": [f"unix://{socket_path}"], "shutdown_grace_seconds": 0.5},
        "store": {"sqlite_path": str(tmp_path / "store.db")},
        "auth": _auth(jwks.url, jwks_timeout_seconds=60)}))
    sidecar = SidecarProcess(config, socket_path, tmp_path / "sidecar.err", tmp_path / "appended.log")
    try:
        await sidecar.wait_serving()
        async with AsyncClient(sidecar.target, token=first.sign(_claims()), timeout=CALL_DEADLINE) as client:
            call = asyncio.ensure_future(client.list_tools())
            await until(lambda: jwks.fetches == 1, what="the key set's fetch")
            sidecar.process.send_signal(signal.SIGTERM)
            await until(lambda: sidecar.process.poll() is not None, timeout=CALL_DEADLINE,
                        what="the sidecar's exit")
            with pytest.raises(ClientError):
                await call
    finally:
        sidecar.stop()
    assert sidecar.process.returncode == 0
    assert "toolbooth stopped" in sidecar.output()
