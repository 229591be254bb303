"""The plugin author's side, used carelessly: ``toolbooth plugin new`` with names and directories it cannot use,
and the test kit (``sidecar.plugin.testing``) with failing tools, broken policies and a gate kept past its block.

``plugin new`` refuses a package name an import already finds (it would shadow the standard library's or an
installed module, or be shadowed by it: the package it writes would not pass its own tests), and a directory it
cannot write is an error naming it, never a traceback, with nothing left behind. The kit reports a tool that
raises or overruns as the sidecar does, refuses a broken policy directory as it opens, keeps two gates apart,
and a gate used after its block says so.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from sidecar.cli import main
from sidecar.errors import PolicyLoadError
from sidecar.plugin import ErrorCode, Plugin, SideEffect, ToolContext, tool
from sidecar.plugin.testing import Status, make_context, open_gate, principal_for

pytestmark = pytest.mark.integration


class Numbers(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: int = 0


class Answer(BaseModel):
    y: int


class Base(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: int = 10


@tool(name="kit_add", version="1.0.0", side_effect=SideEffect.NONE, timeout=1.0, permissions=("kit:add",),
      labels=("pii",))
async def add(args: Numbers, ctx: ToolContext) -> Answer:
    return Answer(y=args.x + 1)


@tool(name="kit_raises", version="1.0.0", side_effect=SideEffect.NONE, timeout=1.0)
async def raises(args: Numbers, ctx: ToolContext) -> Answer:
    raise RuntimeError("the secret connection string is postgres://admin:hunter2@db")


@tool(name="kit_hangs", version="1.0.0", side_effect=SideEffect.NONE, timeout=0.05)
async def hangs(args: Numbers, ctx: ToolContext) -> Answer:
    await asyncio.Event().wait()  # never set: only the tool's timeout ends it
    raise AssertionError("unreachable")


@tool(name="kit_based", version="1.0.0", side_effect=SideEffect.NONE, timeout=1.0)
async def based(args: Numbers, ctx: ToolContext) -> Answer:
    return Answer(y=ctx.plugin_settings(Base).base + args.x)


# --- plugin new ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["json", "asyncio", "typing", "site", "yaml", "pydantic", "pytest", "grpc",
                                  "toolbooth-calculator", "conftest"])
def test_a_name_an_import_already_finds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   name: str) -> None:
    assert main(["plugin", "new", name, "--directory", str(tmp_path), "--output", "json"]) == 2
    error = json.loads(capsys.readouterr().err)["error"]
    assert (error["code"], error["exit_code"]) == ("USAGE", 2)
    assert f"plugin name {name!r}" in error["message"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["", "-x", "a b", "../evil", "Upper", "é", "a" * 51, "class", "toolbooth"])
def test_a_name_that_is_no_package_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  name: str) -> None:
    assert main(["plugin", "new", name, "--directory", str(tmp_path), "--output", "json"]) == 2
    assert json.loads(capsys.readouterr().err)["error"]["exit_code"] == 2
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "evil").exists()


@pytest.mark.parametrize("where", ["a-file", "a-file/below", "/proc"])
def test_a_directory_it_cannot_write_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 where: str) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    directory = where if where.startswith("/") else str(tmp_path / where)
    assert main(["plugin", "new", "acme-notes", "--directory", directory, "--output", "json"]) == 1
    error = json.loads(capsys.readouterr().err)["error"]
    assert (error["code"], error["exit_code"]) == ("CANNOT_WRITE", 1)
    assert error["message"].startswith(f"cannot write {directory}/acme-notes: ")
    assert [path.name for path in tmp_path.iterdir()] == ["a-file"]


def test_a_write_failing_halfway_leaves_nothing_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    written = Path.write_text

    def full_disk(path: Path, text: str, *args: object, **kwargs: object) -> int:
        if path.name == "conftest.py":
            raise OSError(28, "No space left on device")
        return written(path, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full_disk)
    assert main(["plugin", "new", "acme-notes", "--directory", str(tmp_path)]) == 1
    assert "No space left on device (what it wrote was removed)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# --- make_context -----------------------------------------------------------------------------------------


def test_a_context_carries_what_the_tool_declares() -> None:
    context = make_context(add)
    assert context.declared_labels == frozenset({"pii"})
    assert context.principal.permissions == ("kit:add",) and context.principal.tenant == "test"
    assert make_context(raises).principal.permissions == ()  # a tool needing no permission: none held
    assert make_context().principal == principal_for()


async def test_settings_given_to_a_context_reach_the_handler() -> None:
    output = await based(Numbers(x=1), make_context(based, settings=Base(base=5)))
    assert isinstance(output, Answer) and output.y == 6
    with pytest.raises(TypeError, match="holds no Base settings"):  # a plugin's tool, not configured: said so
        await based(Numbers(x=1), make_context(based))


# --- open_gate --------------------------------------------------------------------------------------------


async def test_a_tool_that_raises_or_overruns_answers_as_the_sidecar_does() -> None:
    async with open_gate([raises, hangs]) as gate:
        failed = await gate.call(raises, {})
        overran = await gate.call(hangs, {})
        events = await gate.audit_events()
    assert failed.error is not None and failed.error.code is ErrorCode.INTERNAL_ERROR
    assert "hunter2" not in failed.model_dump_json()  # the exception's text stays in the log
    assert overran.error is not None and overran.error.code is ErrorCode.TIMEOUT
    assert [event.error_code for event in events] == ["INTERNAL_ERROR", "TIMEOUT"]


async def test_a_broken_policy_directory_is_refused_as_the_gate_opens(tmp_path: Path) -> None:
    (tmp_path / "broken.rego").write_text("package broken\n\nthis is not rego\n")
    with pytest.raises(PolicyLoadError, match=r"broken\.rego"):
        async with open_gate([add], policies=tmp_path):
            pytest.fail("a gate opened over policies that do not compile")
    with pytest.raises(PolicyLoadError, match="does not exist"):
        async with open_gate([add], policies=tmp_path / "missing"):
            pytest.fail("a gate opened over a missing policy directory")


async def test_a_policy_that_denies_is_a_result(tmp_path: Path) -> None:
    async with open_gate([add], principal=principal_for(raises)) as gate:  # holds no kit:add
        denied = await gate.call(add, {"x": 1})
    assert denied.status is not Status.SUCCESS
    assert denied.error is not None and denied.error.code is ErrorCode.PERMISSION_DENIED


async def test_two_gates_keep_their_stores_apart() -> None:
    async with open_gate([add]) as first, open_gate(Plugin([based], settings=Base), plugin_settings={"base": 7}) \
            as second:
        assert (await first.call(add, {"x": 1})).data == {"y": 2}
        assert (await second.call(based, {"x": 1})).data == {"y": 8}
        assert [event.tool for event in await first.audit_events()] == ["kit_add"]
        assert [event.tool for event in await second.audit_events()] == ["kit_based"]


async def test_a_gate_used_after_its_block_says_it_is_closed() -> None:
    async with open_gate([add]) as gate:
        assert (await gate.call(add, {"x": 1})).status is Status.SUCCESS
    with pytest.raises(RuntimeError, match="this Gate is closed"):
        await gate.call(add, {"x": 1})
    with pytest.raises(RuntimeError, match="this Gate is closed"):
        await gate.list_tools()
    with pytest.raises(RuntimeError, match="this Gate is closed"):
        await gate.audit_events()


async def test_gates_leave_no_directory_and_no_thread_behind() -> None:
    async with open_gate([add]) as warm:  # the process's one policy thread starts with the first gate
        await warm.call(add, {})
    threads = set(threading.enumerate())
    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("toolbooth-gate-*"))
    for _ in range(3):
        with pytest.raises(LookupError):
            async with open_gate([add]) as gate:
                await gate.call(add, {"x": 1})
                raise LookupError("the test failed inside the block")
    assert set(scratch.glob("toolbooth-gate-*")) == before
    assert {t for t in threading.enumerate() if t.is_alive()} <= threads
