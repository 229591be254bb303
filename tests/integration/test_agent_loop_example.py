"""``examples/agent_loop.py`` run as a user runs it, against a real sidecar (``serve``, in this process, over a
Unix socket): its output is checked line by line, so the example cannot rot.

The sidecar serves ``calculate`` and the demo plugin's tools (``examples/demo_tools``, imported from its
directory); a write or a message the example makes shows in the plugin's ``NOTES`` and ``OUTBOX``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sidecar.bootstrap import serve
from sidecar.config import Settings
from sidecar.tools.registry import Registry
from tests.support.waiting import until
from toolbooth_calculator import TOOLS as CALCULATOR

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agent_loop.py"

Serve = Callable[..., Awaitable[str]]


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The demo plugin's module, its notes and messages cleared."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "demo_tools"))
    import toolbooth_demo_tools

    toolbooth_demo_tools.NOTES.clear()
    toolbooth_demo_tools.OUTBOX.clear()
    return toolbooth_demo_tools


@pytest.fixture
async def sidecar(make_settings: Callable[..., Settings], socket_path: Path) -> AsyncIterator[Serve]:
    """``await sidecar(tools, **sections)``: ``serve`` with those tools on ``socket_path``; its target."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def start(tools: list[Any], **sections: Any) -> str:
        settings = make_settings(server={"listen": [f"unix://{socket_path}"]}, **sections)
        tasks.append(task := asyncio.create_task(serve(settings, registry=Registry.from_tools(tools), stop=stop)))
        await until(lambda: socket_path.exists() or task.done(), what="the sidecar listening")
        if task.done():
            task.result()  # start-up failed: raise its error
        return f"unix://{socket_path}"

    yield start
    stop.set()
    await asyncio.gather(*tasks)


async def run_example(*args: str, **env: str) -> list[str]:
    """Run the example with ``args``; its output lines (it must exit 0, within a minute)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLBOOTH_") and k != "APPROVER_JWT"}
    process = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), *args, env={**clean, **env},
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return out.decode().splitlines()


def line(lines: list[str], start: str) -> str:
    """The one line that starts with ``start`` once stripped."""
    found = [text.strip() for text in lines if text.strip().startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


def index(lines: list[str], start: str) -> int:
    return next(i for i, text in enumerate(lines) if text.strip().startswith(start))


async def test_the_loop_in_dev_mode(sidecar: Serve, demo: ModuleType) -> None:
    lines = await run_example(await sidecar([*CALCULATOR, *demo.TOOLS]))
    assert line(lines, "tools offered:") == "tools offered: calculate, index_documents, save_note, send_message"

    # reply 1: a batch, one permanent failure, the call after it cancelled
    assert line(lines, "call_1 ") == 'call_1 calculate -> success {"result": 5.0, "expression": "2 + 3 = 5"}'
    assert line(lines, "call_2 ") == ("call_2 calculate -> error INVALID_ARGUMENT (retryable: false, "
                                      "correct_arguments): cannot divide by zero")
    assert line(lines, "call_3 ") == ("call_3 calculate -> error CANCELLED (retryable: true, retry_same_request): "
                                      "cancelled because calls[1] of the batch failed permanently "
                                      "(cancel_on_permanent_failure); this call never started and changed nothing")

    # reply 2: progress, the last report always delivered, then the result
    assert index(lines, "call_4 progress 5/5 indexed doc-5") < index(lines, "call_4 index_documents -> success")
    assert line(lines, "call_4 index_documents") == 'call_4 index_documents -> success {"indexed": 5}'

    # replies 3 and 4: held for approval; in dev mode nobody can approve it, so it stays held
    held = line(lines, "call_5 send_message")
    assert held.startswith("call_5 send_message -> approval_required: the tool's effects are external and "
                           "irreversible; preview ")
    preview_id = held.rpartition(" ")[2]
    assert line(lines, "the agent approving its own call:") == ("the agent approving its own call: "
                                                                 "PERMISSION_DENIED: nobody may approve their own call")
    approve = f'toolbooth approve {preview_id} --token "$APPROVER_JWT"'
    assert line(lines, "an approver approves it with:") == f"an approver approves it with: {approve}"
    assert line(lines, "call_6 send_message").endswith(f"preview {preview_id}")
    assert line(lines, "still pending") == "still pending: the same preview"
    assert demo.OUTBOX == []

    # replies 5 and 6: a write, then the same tool call again: replayed
    [first, again] = [text.strip() for text in lines if text.strip().startswith("call_7 save_note")]
    assert first.startswith('call_7 save_note -> success {"note_id": ')
    assert again == first + " (replayed: the stored result of key toolcall:call_7)"
    assert demo.NOTES == ["call the printer company"]
    assert lines[-1] == "the model read 8 results, each the typed result as JSON"


async def test_the_loop_with_an_approver(sidecar: Serve, demo: ModuleType, jwt_auth: dict[str, Any],
                                         make_token: Callable[..., str]) -> None:
    target = await sidecar([*CALCULATOR, *demo.TOOLS], auth=jwt_auth)
    lines = await run_example(target, "--token", make_token(sub="alice"),
                              APPROVER_JWT=make_token(sub="bob", roles=["approver"]))
    assert line(lines, "call_5 send_message").startswith("call_5 send_message -> approval_required")
    assert line(lines, "approved by") == "approved by the approver"
    assert line(lines, "call_6 send_message").startswith('call_6 send_message -> success {"message_id": ')
    assert demo.OUTBOX == ["board@example.com: The launch moves to Friday."]
    assert line(lines, "call_4 index_documents") == 'call_4 index_documents -> success {"indexed": 5}'


async def test_the_loop_skips_what_the_sidecar_does_not_offer(sidecar: Serve) -> None:
    lines = await run_example(await sidecar(CALCULATOR))
    assert line(lines, "tools offered:") == "tools offered: calculate"
    assert line(lines, "call_2 ").startswith("call_2 calculate -> error INVALID_ARGUMENT")
    skipped = [text.strip() for text in lines if "skipped" in text]
    assert [text.split(":")[0] for text in skipped] == ["call_4 index_documents", "call_5 send_message",
                                                        "call_6 send_message", "call_7 save_note", "call_7 save_note"]
    assert skipped[0].endswith("skipped, the sidecar offers no such tool (pip install -e examples/demo_tools, "
                               "then restart it)")
    assert lines[-1] == "the model read 3 results, each the typed result as JSON"


async def test_without_a_sidecar_the_loop_says_how_to_start_one(tmp_path: Path) -> None:
    target = f"unix://{tmp_path / 'none.sock'}"
    process = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), target,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 1
    assert err.decode().startswith("agent_loop: UNAVAILABLE: ")
    assert f"is the sidecar running at {target}? start it with `toolbooth serve`" in err.decode()
