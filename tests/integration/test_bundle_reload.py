"""``serve`` on an OPA bundle — a file or a URL — reloads new revisions and refuses bad signatures."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import AsyncClient
from sidecar.config import Settings, bundled_policy_dir
from sidecar.policy.bundle import build_bundle
from sidecar.policy.reload import ReloadStatus
from sidecar.registry import Registry
from sidecar.server import serve
from tests.support import tools
from tests.support.bundle_server import PATH, bundle_server
from tests.support.signing_keys import key_pair

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


def replace(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


@pytest.fixture
async def serving(make_settings: Callable[..., Settings],
                  socket_path: Path) -> AsyncIterator[Callable[..., Awaitable[AsyncClient]]]:
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    clients: list[AsyncClient] = []

    async def start(bundle_settings: dict[str, Any]) -> AsyncClient:
        settings = make_settings(server={"listen": [f"unix://{socket_path}"]},
                                 policy={"bundle": bundle_settings, "reload_interval_seconds": 0.05})
        tasks.append(asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop)))
        for _ in range(200):
            if socket_path.exists():
                clients.append(client := AsyncClient(f"unix://{socket_path}", timeout=5))
                return client
            if tasks[-1].done():
                tasks[-1].result()
            await asyncio.sleep(0.02)
        raise AssertionError("the sidecar did not start")

    yield start
    for client in clients:
        await client.close()
    stop.set()
    await asyncio.gather(*tasks)


async def until(client: AsyncClient, ready: Callable[[ReloadStatus], bool]) -> ReloadStatus:
    for _ in range(250):
        status = await client.policy_status()
        if ready(status):
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"policy status never became ready: {status}")


async def test_a_bundle_file_reloads_its_next_revision(serving: Any, tmp_path: Path) -> None:
    path = tmp_path / "toolbooth.tar.gz"
    replace(path, bundle(tmp_path, "r1"))
    client = await serving({"file": str(path)})
    assert (await client.policy_status()).revision == "r1"
    assert (await client.execute("echo", {"text": "x"})).meta.policy_revision == "r1"
    replace(path, bundle(tmp_path, "r2", hide_echo=True))
    await until(client, lambda status: status.revision == "r2")
    hidden = await client.execute("echo", {"text": "x"})
    assert hidden.error is not None and hidden.meta.policy_revision == "r2"


async def test_a_wrongly_signed_bundle_is_refused(serving: Any, tmp_path: Path) -> None:
    path = tmp_path / "toolbooth.tar.gz"
    replace(path, bundle(tmp_path, "r1", key=KEY.private))
    client = await serving({"file": str(path), "verification": VERIFICATION})
    assert (await client.policy_status()).revision == "r1"
    replace(path, bundle(tmp_path, "r2", hide_echo=True, key=OTHER_KEY.private))
    refused = await until(client, lambda status: not status.healthy)
    assert refused.revision == "r1" and "signature" in (refused.last_error or "").lower()
    assert (await client.execute("echo", {"text": "x"})).data is not None
    replace(path, bundle(tmp_path, "r3"))  # unsigned, while signatures are required
    unsigned = await until(client, lambda status: status.last_error != refused.last_error)
    assert unsigned.revision == "r1" and not unsigned.healthy


async def test_a_bundle_url_is_polled_with_etags(serving: Any, tmp_path: Path) -> None:
    with bundle_server() as server:
        server.content = bundle(tmp_path, "r1")
        client = await serving({"url": server.url + PATH, "polling_seconds": 0.05})
        assert (await client.policy_status()).revision == "r1"
        await asyncio.sleep(0.2)
        assert any(etag == server.etag for etag, _ in server.seen)  # unchanged: answered 304
        server.content = bundle(tmp_path, "r2", hide_echo=True)
        await until(client, lambda status: status.revision == "r2")
        assert (await client.execute("echo", {"text": "x"})).error is not None
