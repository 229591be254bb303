"""``serve`` on an OPA bundle — a file or a URL — reloads new revisions and refuses bad signatures."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import AsyncClient
from sidecar.config import bundled_policy_dir
from sidecar.policy.bundle import build_bundle
from tests.support.bundle_server import PATH, bundle_server
from tests.support.reloading import rewrite, until_status
from tests.support.signing_keys import key_pair
from tests.support.waiting import until

pytestmark = pytest.mark.integration
KEY, OTHER_KEY = key_pair("HS256", 0), key_pair("HS256", 1)
VERIFICATION = {"keys": {"ops": {"algorithm": "HS256", "key": KEY.public}}}


def bundle(tmp_path: Path, revision: str, *, hide_echo: bool = False, key: str | None = None) -> bytes:
    """The default policies as a bundle; ``hide_echo`` makes ``echo`` an admin-only tool."""
    root = Path(shutil.copytree(bundled_policy_dir(), tmp_path / f"src-{revision}"))
    if hide_echo:
        data = (root / "data.json").read_text()
        (root / "data.json").write_text(data.replace('"admin_console": {', '"echo": {"roles": ["admin"]},\n'
                                                                           '      "admin_console": {', 1))
    return build_bundle(root, revision=revision, signing_key=key, signing_algorithm="HS256",
                        keyid=None if key is None else "ops")



@pytest.fixture
async def serving(serve_in_background: Any) -> AsyncIterator[Callable[..., Awaitable[AsyncClient]]]:
    """Start ``serve`` on a bundle (``policy.bundle`` settings); returns a client to it."""
    clients: list[AsyncClient] = []

    async def start(bundle_settings: dict[str, Any]) -> AsyncClient:
        target = await serve_in_background(policy={"bundle": bundle_settings, "reload_interval_seconds": 0.05})
        clients.append(client := AsyncClient(target, timeout=5))
        return client

    yield start
    for client in clients:
        await client.close()




async def test_a_bundle_file_reloads_its_next_revision(serving: Any, tmp_path: Path) -> None:
    path = tmp_path / "toolbooth.tar.gz"
    rewrite(path, bundle(tmp_path, "r1"))
    client = await serving({"file": str(path)})
    assert (await client.policy_status()).revision == "r1"
    assert (await client.execute("echo", {"text": "x"})).meta.policy_revision == "r1"
    rewrite(path, bundle(tmp_path, "r2", hide_echo=True))
    await until_status(client, lambda status: status.revision == "r2")
    hidden = await client.execute("echo", {"text": "x"})
    assert hidden.error is not None and hidden.meta.policy_revision == "r2"


async def test_a_wrongly_signed_bundle_is_refused(serving: Any, tmp_path: Path) -> None:
    path = tmp_path / "toolbooth.tar.gz"
    rewrite(path, bundle(tmp_path, "r1", key=KEY.private))
    client = await serving({"file": str(path), "verification": VERIFICATION})
    assert (await client.policy_status()).revision == "r1"
    rewrite(path, bundle(tmp_path, "r2", hide_echo=True, key=OTHER_KEY.private))
    refused = await until_status(client, lambda status: not status.healthy)
    assert refused.revision == "r1" and "signature" in (refused.last_error or "").lower()
    assert (await client.execute("echo", {"text": "x"})).data is not None
    rewrite(path, bundle(tmp_path, "r3"))  # unsigned, while signatures are required
    unsigned = await until_status(client, lambda status: status.last_error != refused.last_error)
    assert unsigned.revision == "r1" and not unsigned.healthy


async def test_a_bundle_url_is_polled_with_etags(serving: Any, tmp_path: Path) -> None:
    with bundle_server() as server:
        server.content = bundle(tmp_path, "r1")
        client = await serving({"url": server.url + PATH, "polling_seconds": 0.05})
        assert (await client.policy_status()).revision == "r1"
        await until(lambda: any(etag == server.etag for etag, _ in server.seen),  # unchanged: answered 304
                    timeout=5, what="a poll sending the bundle's ETag")
        server.content = bundle(tmp_path, "r2", hide_echo=True)
        await until_status(client, lambda status: status.revision == "r2")
        assert (await client.execute("echo", {"text": "x"})).error is not None
