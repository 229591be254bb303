"""The plugin test kit without a gate: a decorated tool stays callable, ``make_context`` builds the context the
sidecar would, and ``sidecar.plugin.testing`` imports without pytest."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from pydantic import BaseModel, ConfigDict

from sidecar.contract import Progress
from sidecar.plugin import Partial, Plugin, Principal, SideEffect, ToolContext, ToolDefinitionError, ToolError, tool
from sidecar.plugin.fixtures import ContextFactory, tool_context
from sidecar.plugin.testing import make_context, principal_for

__all__ = ["tool_context"]


class Echo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suffix: str = "!"


@tool(name="shout", version="1.0.0", side_effect=SideEffect.NONE, permissions=("echo:read",), timeout=3.0,
      labels=("loud",))
async def shout(args: Echo, ctx: ToolContext) -> Echo:
    ctx.add_label("loud")
    suffix = ctx.plugin_settings(Settings).suffix if ctx.settings is not None else ""
    return Echo(text=args.text.upper() + suffix)


@tool(name="whisper", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE)
def whisper(args: Echo, ctx: ToolContext) -> Echo | Partial[Echo]:
    if not args.text:
        return Partial(Echo(text=""), errors=[ToolError("INVALID_ARGUMENT", "nothing to whisper")])
    return Echo(text=f"{args.text.lower()} ({ctx.idempotency_key})")


async def test_a_decorated_async_tool_is_called_like_its_handler() -> None:
    ctx = make_context(shout)
    assert await shout(Echo(text="hey"), ctx) == Echo(text="HEY")
    assert ctx.labels == {"loud"}


async def test_a_decorated_sync_tool_is_awaited_the_same_way() -> None:
    ctx = make_context(whisper, idempotency_key="k-1")
    assert await whisper(Echo(text="HEY"), ctx) == Echo(text="hey (k-1)")
    partial = await whisper(Echo(text=""), ctx)
    assert isinstance(partial, Partial) and partial.errors[0].code == "INVALID_ARGUMENT"


def test_a_tool_is_not_decorated_twice() -> None:
    with pytest.raises(ToolDefinitionError, match="field 'handler': must be a function"):
        tool(name="again", version="1", side_effect="none")(shout)


def test_the_context_is_the_one_the_sidecar_gives_the_tool() -> None:
    ctx = make_context(shout)
    assert ctx.declared_labels == {"loud"} and ctx.attempt == 1 and ctx.idempotency_key is None
    assert ctx.principal == Principal(id="test-user", tenant="test", permissions=("echo:read",))
    assert 2.5 < ctx.time_remaining() <= 3.0  # the tool's timeout
    assert ctx.request_id != make_context(shout).request_id


def test_a_tool_with_side_effects_gets_a_new_key_unless_given_one() -> None:
    first, second = make_context(whisper).idempotency_key, make_context(whisper).idempotency_key
    assert first and second and first != second
    assert make_context(whisper, idempotency_key="mine").idempotency_key == "mine"


async def test_settings_are_the_tools_bound_ones_unless_given() -> None:
    [configured] = Plugin([shout], settings=Settings).configure("echo", {"suffix": "!"})
    assert await configured(Echo(text="a"), make_context(configured)) == Echo(text="A!")
    assert await shout(Echo(text="a"), make_context(shout, settings=Settings(suffix="?"))) == Echo(text="A?")


def test_every_option_reaches_the_context() -> None:
    reports: list[Progress] = []

    class Sink:
        def report(self, update: Progress) -> None:
            reports.append(update)

    who = principal_for(shout, roles=("developer",))
    ctx = make_context(shout, principal=who, conversation_id="c-1", approved_preview={"a": 1}, seconds=60,
                       attempt=2, request_id="r-1", progress_sink=Sink())
    ctx.report_progress_sync(1, total=2)
    assert (ctx.principal.roles, ctx.conversation_id, ctx.approved_preview, ctx.attempt, ctx.request_id) == (
        ("developer",), "c-1", {"a": 1}, 2, "r-1")
    assert ctx.deadline > time.monotonic() + 59 and reports == [Progress(progress=1, total=2)]
    assert make_context().declared_labels == frozenset() and make_context().principal.permissions == ()


def test_the_fixture_is_the_factory(tool_context: ContextFactory) -> None:
    assert tool_context(shout).declared_labels == {"loud"}


def test_the_kit_imports_without_pytest() -> None:
    code = ("import sys; sys.modules['pytest'] = None; sys.modules['pytest_asyncio'] = None\n"
            "import sidecar.plugin.testing\n"
            "assert 'sidecar.bootstrap' not in sys.modules  # opened only with a gate")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
