"""``Client.tool_schemas``: the caller's listing from a real sidecar, as OpenAI, Anthropic and MCP tool objects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sidecar.api.schemas import mcp_tool
from sidecar.client import AsyncClient, Client
from sidecar.config import Settings
from tests.conftest import PipelineFactory
from tests.integration.conftest import StartSidecar

pytestmark = pytest.mark.integration


async def test_the_async_client_exports_what_the_policy_shows_the_caller(
    make_settings: Callable[..., Settings], start_sidecar: StartSidecar, make_pipeline: PipelineFactory,
    jwt_auth: dict[str, object], make_token: Callable[..., str],
) -> None:
    pipeline = await make_pipeline()
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), pipeline)
    target = sidecar.addresses[0]
    async with AsyncClient(target, token=make_token()) as developer, \
            AsyncClient(target, token=make_token(sub="root", roles=["admin"])) as admin:
        openai = await developer.tool_schemas("openai")
        names = [tool["function"]["name"] for tool in openai]
        assert "echo" in names and "admin_console" not in names  # hidden by the availability policy
        assert "admin_console" in [tool["name"] for tool in await admin.tool_schemas("anthropic")]
        by_name = {tool["function"]["name"]: tool["function"] for tool in openai}
        assert by_name["echo"]["strict"] is False  # Text.text has maxLength
        listing = await developer.list_tools()
        assert await developer.tool_schemas("mcp") == [mcp_tool(tool) for tool in listing.tools]


async def test_the_blocking_client_exports_and_refuses_an_unknown_format_before_asking(
    make_settings: Callable[..., Settings], start_sidecar: StartSidecar, make_pipeline: PipelineFactory,
) -> None:
    sidecar = await start_sidecar(make_settings(), await make_pipeline())

    def export() -> list[str]:
        with Client(sidecar.addresses[0]) as client:
            with pytest.raises(ValueError, match="unknown tool schema format 'gemini'"):
                client.tool_schemas("gemini")
            return [tool["name"] for tool in client.tool_schemas("anthropic", conversation_id="c-1")]

    names = await asyncio.to_thread(export)
    assert "echo" in names and "admin_console" not in names
