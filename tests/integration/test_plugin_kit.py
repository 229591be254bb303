"""The plugin test kit's gate: calls through the sidecar's own pipeline, in-process, with the bundled policies or
a given directory: permissions, validation, idempotency, approval, audit and plugin settings, as a caller sees
them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sidecar.config import bundled_policy_dir
from sidecar.contract import ErrorCode
from sidecar.plugin import Plugin, Principal, SideEffect, ToolContext, tool
from sidecar.plugin.fixtures import GateOpener, toolbooth_gate
from sidecar.plugin.testing import Status, open_gate, principal_for

__all__ = ["toolbooth_gate"]

RUNS: list[str] = []  # each handler run, by the text it got


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=20)


class NoteSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str = ""


@tool(name="read_note", version="1.0.0", side_effect=SideEffect.NONE, permissions=("notes:read",))
async def read_note(args: Note, ctx: ToolContext) -> Note:
    return Note(text=args.text)


@tool(name="write_note", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, permissions=("notes:write",))
async def write_note(args: Note, ctx: ToolContext) -> Note:
    RUNS.append(args.text)
    return Note(text=ctx.plugin_settings(NoteSettings).prefix + args.text if ctx.settings else args.text)


@tool(name="publish_note", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE)
async def publish_note(args: Note, ctx: ToolContext) -> Note:
    RUNS.append(args.text)
    return Note(text=args.text)


async def test_a_call_succeeds_and_is_audited() -> None:
    async with open_gate([read_note]) as gate:
        result = await gate.call(read_note, {"text": "hello"})
        events = await gate.audit_events()
    assert result.status is Status.SUCCESS and result.data == {"text": "hello"}
    assert [(event.tool, event.status, event.principal_id) for event in events] == [
        ("read_note", "success", "test-user")]


async def test_the_policies_and_the_validation_answer_as_to_any_caller() -> None:
    async with open_gate([read_note]) as gate:
        denied = await gate.call("read_note", {"text": "hello"}, principal=Principal(id="eve", tenant="test"))
        invalid = await gate.call("read_note", {"text": ""})
        unknown = await gate.call("no_such_tool", {})
    assert denied.error is not None and denied.error.code is ErrorCode.PERMISSION_DENIED
    assert invalid.error is not None and (invalid.error.code, invalid.error.field) == (ErrorCode.INVALID_ARGUMENT,
                                                                                      "text")
    assert unknown.status is Status.ERROR


async def test_a_write_runs_once_per_key_and_needs_one() -> None:
    RUNS.clear()
    async with open_gate([write_note]) as gate:
        first = await gate.call(write_note, {"text": "once"}, idempotency_key="k-1")
        again = await gate.call(write_note, {"text": "once"}, idempotency_key="k-1")
        keyless = await gate.call(write_note, {"text": "once"})
    assert first.status is again.status is Status.SUCCESS and again.meta.idempotency_replayed
    assert RUNS == ["once"]
    assert keyless.error is not None and keyless.status is Status.ERROR


async def test_an_irreversible_call_runs_once_approved() -> None:
    RUNS.clear()
    async with open_gate([publish_note]) as gate:
        held = await gate.call(publish_note, {"text": "news"}, idempotency_key="k-1")
        assert held.status is Status.APPROVAL_REQUIRED and not RUNS
        approval_id = await gate.approve(held)
        done = await gate.call(publish_note, {"text": "news"}, idempotency_key="k-1", approval_id=approval_id)
    assert done.status is Status.SUCCESS and RUNS == ["news"]


async def test_a_plugin_is_configured_as_the_operator_configures_it() -> None:
    plugin = Plugin([write_note], settings=NoteSettings)
    async with open_gate(plugin, plugin_name="notes", plugin_settings={"prefix": "> "}) as gate:
        result = await gate.call(write_note, {"text": "hi"}, idempotency_key="k-1")
    assert result.data == {"text": "> hi"}


async def test_a_given_policy_directory_decides(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(bundled_policy_dir(), policies)
    data = json.loads((policies / "data.json").read_text())
    data["toolbooth"]["tools"]["read_note"] = {"roles": ["admin"]}  # only admins may use it
    (policies / "data.json").write_text(json.dumps(data))
    async with open_gate([read_note], policies=policies) as gate:
        refused = await gate.call(read_note, {"text": "hello"})
        admin = await gate.call(read_note, {"text": "hello"}, principal=principal_for(read_note, roles=("admin",)))
        listed = await gate.list_tools()
    assert refused.status is Status.ERROR and admin.status is Status.SUCCESS
    assert [descriptor.name for descriptor in listed.tools] == []


async def test_the_fixture_opens_gates_that_close_with_the_test(toolbooth_gate: GateOpener, tmp_path: Path) -> None:
    first = await toolbooth_gate([read_note])
    second = await toolbooth_gate([read_note, write_note], principal=principal_for(write_note))
    assert (await first.call(read_note, {"text": "a"})).status is Status.SUCCESS
    refused = await second.call(read_note, {"text": "a"})
    assert refused.error is not None and refused.error.code is ErrorCode.PERMISSION_DENIED
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gate-1", "gate-2"]
