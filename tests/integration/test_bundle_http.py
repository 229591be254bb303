"""Bundles over HTTP: a real server on 127.0.0.1 answers with an ETag and 304 Not Modified."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.config import bundled_policy_dir
from sidecar.errors import BundleFetchError
from sidecar.policy.bundle import build_bundle, load_bundle
from sidecar.policy.bundle.archive import MAX_BUNDLE_BYTES
from sidecar.policy.bundle.fetch import BundleFetcher
from sidecar.policy.embedded import EmbeddedEngine
from tests.support.bundle_server import PATH, BundleServer, bundle_server
from tests.support.certificates import Authority


@pytest.fixture
def server() -> Iterator[BundleServer]:
    with bundle_server() as state:
        yield state


async def test_fetch_then_not_modified_then_a_new_bundle(server: BundleServer, bundled_policies: Path) -> None:
    server.content = build_bundle(bundled_policies)
    fetcher = BundleFetcher(server.url + PATH, headers={"Authorization": "Bearer t0ken"})

    first = await fetcher.fetch()
    assert first.modified and first.content == server.content and first.etag == server.etag == fetcher.etag
    assert EmbeddedEngine.from_bundle(load_bundle(first.content)).revision == \
        EmbeddedEngine.load(bundled_policies).revision

    second = await fetcher.fetch()
    assert not second.modified and second.content is None and second.etag == first.etag

    server.content = build_bundle(bundled_policies, revision="v2")
    third = await fetcher.fetch()
    assert third.modified and third.etag == server.etag != first.etag
    assert third.content is not None and load_bundle(third.content).revision == "v2"
    assert server.seen == [(None, "Bearer t0ken"), (first.etag, "Bearer t0ken"), (first.etag, "Bearer t0ken")]


async def test_a_known_etag_is_sent_from_the_start(server: BundleServer) -> None:
    server.content = build_bundle(bundled_policy_dir())
    result = await BundleFetcher(server.url + PATH, etag=server.etag).fetch()
    assert not result.modified and server.seen == [(server.etag, None)]


async def test_an_http_error_is_a_fetch_error(server: BundleServer) -> None:
    with pytest.raises(BundleFetchError, match=r"GET http://127\.0\.0\.1:\d+/missing\.tar\.gz: HTTP 404"):
        await BundleFetcher(server.url + "/missing.tar.gz").fetch()


async def test_a_server_that_is_down_is_a_fetch_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(BundleFetchError, match=rf"GET http://127\.0\.0\.1:{port}{PATH}: .*refused"):
        await BundleFetcher(f"http://127.0.0.1:{port}{PATH}", timeout=2).fetch()


async def test_a_server_whose_certificate_is_not_trusted_is_named_so(tmp_path: Path) -> None:
    # aiohttp reports OpenSSL's verify error with errno 1, which once read "Operation not permitted".
    cert, key = Authority().issue("localhost").write(tmp_path, "server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def handshake() -> None:
            connection, _ = listener.accept()
            with contextlib.suppress(OSError), context.wrap_socket(connection, server_side=True):
                pass

        threading.Thread(target=handshake, daemon=True).start()
        with pytest.raises(BundleFetchError, match=rf"GET https://localhost:{port}{PATH}: the certificate of "
                                                   rf"localhost:{port} is not trusted: .*certificate"):
            await BundleFetcher(f"https://localhost:{port}{PATH}", timeout=5).fetch()


async def test_a_silent_server_is_a_fetch_error_after_the_timeout(server: BundleServer) -> None:
    server.content, server.delay = b"late", 0.6
    started = time.monotonic()
    with pytest.raises(BundleFetchError, match="timed out"):
        await BundleFetcher(server.url + PATH, timeout=0.2).fetch()
    assert time.monotonic() - started < 0.5


async def test_a_dripping_server_is_cut_off_at_the_timeout(server: BundleServer) -> None:
    server.content, server.drip = b"x" * 100, 0.1  # 10 s for the whole body, a byte well within each read's timeout
    started = time.monotonic()
    with pytest.raises(BundleFetchError, match=r"timed out: no whole answer within 0\.5 s"):
        await BundleFetcher(server.url + PATH, timeout=0.5).fetch()
    assert time.monotonic() - started < 5  # the timeout, with room for a loaded machine


async def test_a_bundle_over_the_limit_is_a_fetch_error(server: BundleServer) -> None:
    server.content = b"x" * (MAX_BUNDLE_BYTES + 1)
    with pytest.raises(BundleFetchError, match=rf"the bundle is larger than {MAX_BUNDLE_BYTES} bytes"):
        await BundleFetcher(server.url + PATH).fetch()


def test_only_http_urls_are_fetched() -> None:
    with pytest.raises(ValueError, match="must be http:// or https://"):
        BundleFetcher("file:///etc/passwd")
