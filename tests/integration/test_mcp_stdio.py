"""``toolbooth mcp-stdio``: started by the MCP SDK's stdio client, bridging to a real sidecar over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from sidecar.config import Settings
from sidecar.contract import ErrorCode, Status
from sidecar.server import Sidecar
from tests.conftest import PipelineFactory
from tests.integration.conftest import StartSidecar
from tests.support import tools
from tests.support.mcp import stdio_session, typed

pytestmark = pytest.mark.integration


@pytest.fixture
async def sidecar(make_settings: Callable[..., Settings], start_sidecar: StartSidecar, make_pipeline: PipelineFactory,
                  jwt_auth: dict[str, Any]) -> AsyncIterator[Sidecar]:
    """A JWT sidecar with the test tools and the default policies, on 127.0.0.1."""
    yield await start_sidecar(make_settings(auth=jwt_auth), await make_pipeline())


async def test_the_bridge_lists_and_calls_as_the_tokens_principal(sidecar: Sidecar,
                                                                  make_token: Callable[..., str]) -> None:
    env = {"TOOLBOOTH_TOKEN": make_token(sub="alice")}
    async with stdio_session("--target", sidecar.addresses[-1], env=env) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        echoed = await session.call_tool("echo", {"text": "over stdio"})
        invalid = await session.call_tool("echo", {"text": 5})
        hidden = await session.call_tool("admin_console", {"text": "x"})
    assert "echo" in listed and "admin_console" not in listed
    assert listed["echo"].output_schema is not None and listed["echo"].annotations is not None
    assert typed(echoed.structured_content).data == {"text": "over stdio", "principal": "alice", "attempt": 1}
    assert invalid.is_error and typed(invalid.structured_content).error.field == "text"  # type: ignore[union-attr]
    assert hidden.is_error
    assert typed(hidden.structured_content).error.code is ErrorCode.TOOL_UNAVAILABLE  # type: ignore[union-attr]


async def test_the_token_can_come_from_a_file_a_keyed_write_is_replayed_and_approval_is_asked(
    sidecar: Sidecar, make_token: Callable[..., str], tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(make_token(sub="bob") + "\n")
    before = tools.CREATED.value
    key = {"toolbooth/idempotency_key": "stdio-1"}
    async with stdio_session("--target", sidecar.addresses[-1], env={"TOOLBOOTH_TOKEN_FILE": str(token_file)}) as s:
        first = typed((await s.call_tool("create_note", {"text": "a"}, meta=key)).structured_content)
        again = typed((await s.call_tool("create_note", {"text": "a"}, meta=key)).structured_content)
        unkeyed = typed((await s.call_tool("create_note", {"text": "a"})).structured_content)
        email = await s.call_tool("send_email", {"text": "hello"}, meta={"toolbooth/idempotency_key": "mail-1"})
    assert email.is_error and typed(email.structured_content).status is Status.APPROVAL_REQUIRED
    assert typed(email.structured_content).preview is not None  # what the client shows an approver
    assert first.status is Status.SUCCESS and first.data == again.data == {"count": before + 1}
    assert again.meta.idempotency_replayed and tools.CREATED.value == before + 1
    assert unkeyed.error is not None and unkeyed.error.field == "idempotency_key"


async def test_progress_reports_are_bridged_from_the_sidecars_stream(
    make_settings: Callable[..., Settings], start_sidecar: StartSidecar, make_pipeline: PipelineFactory,
) -> None:
    from sidecar.tools.registry import Registry

    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, tools.count_up]))
    sidecar = await start_sidecar(make_settings(), pipeline)  # dev mode on loopback
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with stdio_session("--target", sidecar.addresses[-1]) as session:
        answer = await session.call_tool("count_up", {"count": 20}, progress_callback=on_progress)
    assert typed(answer.structured_content).data == {"count": 20}
    assert seen and seen[-1] == 20 and seen == sorted(set(seen))


async def test_a_refused_token_is_a_protocol_error_with_the_sidecars_message(sidecar: Sidecar) -> None:
    async with stdio_session("--target", sidecar.addresses[-1], "--token", "not-a-jwt") as session:
        with pytest.raises(MCPError, match=r"^unauthenticated: invalid token$"):
            await session.list_tools()


async def test_an_unreachable_sidecar_is_service_unavailable(tmp_path: Path) -> None:
    with (tmp_path / "bridge.log").open("w+") as errlog:
        async with stdio_session("--target", f"unix://{tmp_path}/none.sock", errlog=errlog) as session:
            with pytest.raises(MCPError, match=r"^service unavailable$"):
                await session.call_tool("echo", {"text": "x"})
        errlog.seek(0)
        assert f"the sidecar at unix://{tmp_path}/none.sock failed the request: UNAVAILABLE" in errlog.read()


def test_an_unreadable_token_file_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sidecar", "mcp-stdio", "--target", "unix:///x.sock",
                           "--token-file", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2
    missing = tmp_path / "missing"
    assert done.stderr == f"toolbooth: error: cannot read --token-file {missing}: No such file or directory\n"


_LIST = b'"jsonrpc":"2.0","method":"tools/list"'
_UNREADABLE = [  # each line, and the code and words of its answer
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"x":"\\ud800"}}}', -32700, "not one JSON"),
    (b"[" * 5000 + b"]" * 5000, -32700, "not one JSON"),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"x":"\xff\xfe"}}}', -32700, "not one JSON"),
    (b"{" + _LIST + b',"id":', -32700, "not one JSON"),
    (b"[{" + _LIST + b',"id":1}]', -32600, "batches are not part of MCP"),
    (b"7", -32600, "one JSON object"),
    *[(b"{" + _LIST + b',"id":' + bad + b"}", -32600, "a string or an integer")
      for bad in (b"{}", b"[]", b"1.5", b"true")],
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"x":"' + b"x" * 100_000 + b'"}}}', -32600,
     "longer than the bridge accepts"),
]


class _Lines:
    """A ``toolbooth mcp-stdio`` process spoken to line by line, its session initialized."""

    def __init__(self, bridge: asyncio.subprocess.Process) -> None:
        assert bridge.stdin is not None and bridge.stdout is not None
        self.stdin, self.stdout = bridge.stdin, bridge.stdout

    async def send(self, line: bytes) -> None:
        self.stdin.write(line + b"\n")
        await self.stdin.drain()

    async def answer(self, line: bytes | None = None) -> dict[str, Any]:
        """The next line from the bridge (after sending ``line``); before the fix some never came."""
        if line is not None:
            await self.send(line)
        async with asyncio.timeout(30):
            return json.loads(await self.stdout.readline())  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def _lines(target: str, token: str, *args: str) -> AsyncIterator[_Lines]:
    bridge = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "mcp-stdio", "--target", target, *args,
        env={**os.environ, "TOOLBOOTH_TOKEN": token}, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        limit=1 << 20)
    lines = _Lines(bridge)
    try:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        assert "result" in await lines.answer(json.dumps(init).encode())
        await lines.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        yield lines
    finally:
        lines.stdin.close()
        async with asyncio.timeout(30):
            assert await bridge.wait() == 0


@pytest.mark.slow
async def test_every_line_gets_an_answer_even_one_that_is_no_json_rpc_message(sidecar: Sidecar,
                                                                             make_token: Callable[..., str]) -> None:
    async with _lines(sidecar.addresses[-1], make_token(sub="alice"), "--max-message-bytes", "65536") as lines:
        for line, code, says in _UNREADABLE:
            error = await lines.answer(line)
            assert (error["id"], error["error"]["code"]) == (None, code), line[:80]
            assert says in error["error"]["message"]
        listed = await lines.answer(b"{" + _LIST + b',"id":2}')
    assert listed["id"] == 2 and "echo" in {tool["name"] for tool in listed["result"]["tools"]}


@pytest.mark.slow
async def test_a_request_id_in_flight_is_refused_and_the_first_runs_once(
    make_settings: Callable[..., Settings], start_sidecar: StartSidecar, make_pipeline: PipelineFactory,
) -> None:
    from sidecar.tools.registry import Registry

    sidecar = await start_sidecar(make_settings(), await make_pipeline(registry=Registry.from_tools([tools.held_note])))
    tools.HOLD.close()
    started = tools.HELD_STARTED.value

    def held(request_id: str, key: str) -> bytes:
        params = {"name": "held_note", "arguments": {"text": "x"}, "_meta": {"toolbooth/idempotency_key": key}}
        return b'{"jsonrpc":"2.0","method":"tools/call","id":' + request_id.encode() + b',"params":' + \
            json.dumps(params).encode() + b"}"

    async with _lines(sidecar.addresses[-1], "") as lines:
        await lines.send(held("5", "stdio-dup-1"))
        await tools.HELD_STARTED.reached(started + 1)
        duplicates = [await lines.answer(held(same, "stdio-dup-2")) for same in ("5", '"5"')]
        tools.HOLD.open()
        answered = await lines.answer()
    assert [(d["id"], d["error"]["code"]) for d in duplicates] == [(None, -32600)] * 2
    assert "in flight in this session" in duplicates[0]["error"]["message"]
    assert answered["id"] == 5 and answered["result"]["structuredContent"]["status"] == "success"
    assert tools.HELD_STARTED.value == started + 1  # exactly one execution


def test_a_max_message_bytes_that_is_not_positive_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "sidecar", "mcp-stdio", "--target", "unix:///x.sock",
                           "--max-message-bytes", "0"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)
    assert (done.returncode, done.stderr) == (2, "toolbooth: error: --max-message-bytes must be a positive number "
                                                 "of bytes\n")
