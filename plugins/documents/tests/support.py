"""Helpers of the documents plugin's tests: the plugin's settings as variables, tokens, a corpus on disk, a sidecar, a
proxy that drops connections."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient
from sidecar.config import load_settings, parse_settings
from sidecar.contract import ToolResult
from sidecar.pipeline import Pipeline
from sidecar.plugin import ToolDefinition, read_plugin_settings
from sidecar.server import Sidecar, create_server
from sidecar.tools.registry import Registry
from toolbooth_documents.index import Index
from toolbooth_documents.loader import load_directory
from toolbooth_documents.records import Change
from toolbooth_documents.settings import IndexSettings

ISSUER, AUDIENCE = "https://issuer.example", "toolbooth"
SECRET = "documents-plugin-tests-hmac-secret-0123456789abcdef0123456789abcdef"
READER = ("documents:search", "documents:read")
# The plugin's settings as an operator sets them in the environment (``plugins.config.documents``).
ENV_PREFIX = "TOOLBOOTH_PLUGINS__CONFIG__DOCUMENTS__"
ENV_DB, ENV_POSTGRES_DSN, ENV_CURSOR_KEY_FILE = (f"{ENV_PREFIX}SQLITE_PATH", f"{ENV_PREFIX}POSTGRES_DSN",
                                                 f"{ENV_PREFIX}CURSOR_KEY_FILE")


def configured() -> IndexSettings:
    """The plugin's settings the variables of the test name, as the sidecar and ``toolbooth-documents`` read them."""
    return read_plugin_settings("documents", IndexSettings, env=_plugin_variables())


def configured_section() -> dict[str, Any]:
    """``plugins.config.documents`` as the variables of the test set it."""
    return load_settings(env=_plugin_variables()).plugins.config.get("documents", {})


def _plugin_variables() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIX)}


def token(tenant: str = "acme", *, subject: str = "user-1", permissions: Iterable[str] = READER) -> str:
    """A valid HS256 token of a caller of ``tenant`` holding ``permissions`` directly."""
    claims = {"sub": subject, "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300, "tenant": tenant,
              "roles": [], "permissions": list(permissions)}
    return jwt.encode(claims, SECRET, algorithm="HS256")


@dataclass
class Corpus:
    """Files written below ``root`` and indexed the way ``toolbooth-documents index`` does."""

    root: Path
    index: Index
    ids: dict[str, str] = field(default_factory=dict)  # "tenant/project/name" -> document id

    async def add(self, tenant: str, project: str, files: dict[str, str], *,
                  restricted: bool = False) -> list[tuple[Change, int]]:
        """Write ``files`` (name -> text) into the tenant's project directory and index that directory."""
        directory = self.root / tenant / project
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text, encoding="utf-8")
        documents, skipped = load_directory(directory, tenant=tenant, project_id=project, restricted=restricted)
        assert not skipped
        await self.index.add_project(tenant, project)
        wanted = [doc for doc in documents if doc.source in files]
        for doc in wanted:
            self.ids[f"{tenant}/{project}/{doc.source}"] = doc.document_id
        return await self.index.upsert(wanted)


@dataclass
class Sidecars:
    """Real sidecars (JWT auth, default policies) on 127.0.0.1; ``stop`` ends them all."""

    state: Path
    running: list[tuple[Sidecar, Pipeline]] = field(default_factory=list)

    async def start(self, tools: list[ToolDefinition[Any, Any]] | None = None) -> str:
        """A sidecar serving ``tools``, or the installed plugin's (its entry point) configured by the variables of
        the test; its address."""
        settings = parse_settings({
            "server": {"listen": ["127.0.0.1:0"], "shutdown_grace_seconds": 1},
            "store": {"sqlite_path": str(self.state / f"toolbooth-{len(self.running)}.db")},
            "auth": {"mode": "jwt", "jwt": {"algorithms": ["HS256"], "issuer": ISSUER, "audience": AUDIENCE,
                                            "key": SECRET, "leeway_seconds": 0}},
        })
        registry = (Registry.from_entry_points(allow=["documents"], config={"documents": configured_section()})
                    if tools is None else Registry.from_tools(tools))
        pipeline = await open_pipeline(settings, registry=registry)
        _, sidecar = await create_server(settings, pipeline)
        await sidecar.start()
        self.running.append((sidecar, pipeline))
        return sidecar.addresses[0]

    async def stop(self) -> None:
        for sidecar, pipeline in self.running:
            await sidecar.stop(None)
            await pipeline.aclose()


async def call(address: str, tool: str, arguments: dict[str, Any], *, tenant: str = "acme",
               permissions: Iterable[str] = READER) -> ToolResult:
    """One call of ``tool`` by a caller of ``tenant``, through the sidecar at ``address``."""
    async with AsyncClient(address, token=token(tenant, permissions=permissions), timeout=15) as client:
        return await client.execute(tool, arguments)


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream`` that forwards every connection, except that it closes the next
    ``dropping`` connections as soon as they are accepted (as a restarting server does); ``dropped`` counts those."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.dropping, self.dropped, self.port = upstream, 0, 0, 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, upstream: tuple[str, int]) -> AsyncIterator[DroppingProxy]:
        proxy = cls(upstream)
        server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        proxy.port = server.sockets[0].getsockname()[1]
        try:
            yield proxy
        finally:
            server.close()
            for task in proxy._tasks:
                task.cancel()
            await asyncio.gather(*proxy._tasks, return_exceptions=True)
            for writer in proxy._writers:
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()
            await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self.dropping > 0:
            self.dropping -= 1
            self.dropped += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers.append(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        sink.close()
