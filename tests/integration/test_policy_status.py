"""PolicyService and the ``toolbooth.policy`` health status on a real server."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.bootstrap import assemble
from sidecar.client import AsyncClient, ClientError
from sidecar.config import PolicySettings, Settings, bundled_policy_dir
from sidecar.policy.factory import policy_source
from sidecar.policy.reload import ReloadingEngine
from sidecar.server import create_server
from sidecar.server.policy_service import RELOAD_HEALTH_NAME
from sidecar.server.roles import REFUSED_WITHOUT_DETAILS
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.support import tools
from tests.support.reloading import rewrite

pytestmark = pytest.mark.integration
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING



@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))


@pytest.fixture
async def running(make_settings: Callable[..., Settings], policies: Path,
                  tmp_path: Path) -> AsyncIterator[tuple[str, ReloadingEngine, Any]]:
    settings = make_settings()
    reloader = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    store = await SqliteStore.open(tmp_path / "status.db")
    pipeline = assemble(registry=Registry.from_tools(tools.ALL), policy=reloader, store=store, limits=settings.limits)
    _, sidecar = await create_server(settings, pipeline, policy=reloader)
    reloader.on_status = sidecar.report_policy
    await sidecar.start()
    yield sidecar.addresses[0], reloader, sidecar
    await sidecar.stop(None)
    await pipeline.aclose()


async def reload_health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=RELOAD_HEALTH_NAME)
        return int((await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)).status)


async def test_status_follows_reloads(running: tuple[str, ReloadingEngine, Any], policies: Path) -> None:
    address, reloader, _ = running
    async with AsyncClient(address, timeout=5) as client:
        first = await client.policy_status()
        assert first.revision == reloader.revision and first.source == f"directory {policies}"
        assert first.healthy and await reload_health(address) == SERVING

        original = (policies / "authz.rego").read_text()
        rewrite(policies / "authz.rego", "package toolbooth.authz\n\ndecision := {")
        await reloader.reload_if_changed()
        refused = await client.policy_status()
        assert refused.revision == first.revision and "authz.rego" in (refused.last_error or "")
        assert await reload_health(address) == NOT_SERVING
        served = await client.execute("echo", {"text": "still here"})
        assert served.meta.policy_revision == first.revision and served.data["text"] == "still here"

        rewrite(policies / "authz.rego", original + "\n# changed\n")
        await reloader.reload_if_changed()
        fixed = await client.policy_status()
        assert fixed.healthy and fixed.revision != first.revision
        assert await reload_health(address) == SERVING
        assert (await client.execute("echo", {"text": "x"})).meta.policy_revision == fixed.revision


async def test_status_needs_authentication(make_settings: Callable[..., Settings], policies: Path,
                                           jwt_auth: dict[str, Any], tmp_path: Path) -> None:
    settings = make_settings(auth=jwt_auth)
    reloader = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    _, sidecar = await create_server(settings, _NoCalls(), policy=reloader)
    await sidecar.start()
    try:
        async with AsyncClient(sidecar.addresses[0], timeout=5) as client:
            with pytest.raises(ClientError) as caught:
                await client.policy_status()
        assert caught.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await sidecar.stop(None)


async def test_only_operators_see_why_a_change_was_refused(make_settings: Callable[..., Settings], policies: Path,
                                                          jwt_auth: dict[str, Any],
                                                          make_token: Callable[..., str]) -> None:
    reloader = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    _, sidecar = await create_server(make_settings(auth=jwt_auth), _NoCalls(), policy=reloader)
    await sidecar.start()
    try:
        rewrite(policies / "authz.rego", "package toolbooth.authz\n\ndecision := {")
        await reloader.reload_if_changed()
        seen = {}
        for role in ("developer", "operator"):
            async with AsyncClient(sidecar.addresses[0], token=make_token(roles=[role]), timeout=5) as client:
                seen[role] = (await client.policy_status()).last_error
        assert seen["developer"] == REFUSED_WITHOUT_DETAILS
        assert seen["operator"] is not None and "authz.rego" in seen["operator"]
    finally:
        await sidecar.stop(None)


class _NoCalls:
    async def list_tools(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")
