"""Real sidecars on real sockets: settings, JWT keys and a server-starting fixture.

``start_sidecar(settings, gateway)`` creates, binds and starts a server and returns
its ``Sidecar`` handle (``.addresses`` holds the bound ``unix:///…`` and
``127.0.0.1:<port>`` addresses); every server started is stopped at teardown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sidecar.config import Settings, parse_settings
from sidecar.server import Sidecar, create_server
from sidecar.server.tool_service import ToolGateway

ISSUER, AUDIENCE = "https://issuer.example", "toolbooth"

StartSidecar = Callable[[Settings, ToolGateway], Awaitable[Sidecar]]


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    """Where the test sidecar's Unix socket goes: in a directory that does not exist yet."""
    return tmp_path / "run" / "tb.sock"


@pytest.fixture
def make_settings(tmp_path: Path, socket_path: Path) -> Callable[..., Settings]:
    """``make_settings(**sections)``: dev-mode settings listening on ``socket_path`` and ``127.0.0.1:0``,
    with the store in ``tmp_path``; each keyword overrides keys of one section."""

    def make(**sections: dict[str, Any]) -> Settings:
        raw: dict[str, dict[str, Any]] = {
            "server": {"listen": [f"unix://{socket_path}", "127.0.0.1:0"], "shutdown_grace_seconds": 2},
            "store": {"sqlite_path": str(tmp_path / "toolbooth.db")},
        }
        for name, values in sections.items():
            raw[name] = {**raw.get(name, {}), **values}
        return parse_settings(raw)

    return make


@pytest.fixture(scope="session")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def jwt_auth(rsa_key: rsa.RSAPrivateKey) -> dict[str, Any]:
    """The ``auth`` section for JWT mode, verifying with ``rsa_key``."""
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return {"mode": "jwt", "jwt": {"algorithms": ["RS256"], "issuer": ISSUER, "audience": AUDIENCE,
                                   "key": public_pem, "leeway_seconds": 0}}


@pytest.fixture
def make_token(rsa_key: rsa.RSAPrivateKey) -> Callable[..., str]:
    """``make_token(**claims)``: an RS256 token valid for 5 minutes; a claim set to ``None`` is left out."""

    def make(**changes: Any) -> str:
        claims = {"sub": "user-1", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300,
                  "tenant": "acme", "roles": ["developer"]}
        claims.update(changes)
        return jwt.encode({k: v for k, v in claims.items() if v is not None}, rsa_key, algorithm="RS256")

    return make


@pytest.fixture
async def start_sidecar() -> AsyncIterator[StartSidecar]:
    """Start real servers; all of them are stopped (without grace) at teardown."""
    started: list[Sidecar] = []

    async def start(settings: Settings, gateway: ToolGateway) -> Sidecar:
        _, sidecar = await create_server(settings, gateway)
        started.append(sidecar)
        await sidecar.start()
        return sidecar

    yield start
    for sidecar in started:
        await sidecar.stop(None)


ServeInBackground = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve_in_background(make_settings: Callable[..., Settings],
                              socket_path: Path) -> AsyncIterator[ServeInBackground]:
    """``await serve_in_background(**sections)``: run ``serve`` (test tools, Unix socket only) as a task;
    returns its ``unix://`` target once listening. Every one is stopped at teardown."""
    from sidecar.bootstrap import serve
    from sidecar.tools.registry import Registry
    from tests.support import tools

    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def start(**sections: dict[str, Any]) -> str:
        server = {"listen": [f"unix://{socket_path}"], **sections.pop("server", {})}
        settings = make_settings(server=server, **sections)
        tasks.append(task := asyncio.create_task(serve(settings, registry=Registry.from_tools(tools.ALL), stop=stop)))
        for _ in range(250):
            if socket_path.exists():
                return f"unix://{socket_path}"
            if task.done():
                task.result()  # start-up failed: raise its error
            await asyncio.sleep(0.02)
        raise AssertionError("the sidecar did not start")

    yield start
    stop.set()
    await asyncio.gather(*tasks)
