"""Tool definitions are checked at registration; errors name plugin, tool and field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from sidecar.contract import ErrorCode
from sidecar.plugin import RetryPolicy, SideEffect, ToolContext, ToolDefinitionError, ToolError, tool


class In(BaseModel):
    x: int


class Out(BaseModel):
    y: int


async def good(args: In, ctx: ToolContext) -> Out:
    """Double x."""
    return Out(y=2 * args.x)


async def untyped_input(args: dict, ctx: ToolContext) -> Out:  # type: ignore[type-arg]
    return Out(y=0)


async def untyped_output(args: In, ctx: ToolContext) -> dict:  # type: ignore[type-arg]
    return {}


async def three_params(args: In, ctx: ToolContext, extra: int) -> Out:
    return Out(y=extra)


def define(handler: Any = good, **overrides: Any) -> Any:
    options: dict[str, Any] = {"name": "double", "version": "1.0.0", "side_effect": SideEffect.NONE}
    return tool(**(options | overrides))(handler)


def test_valid_definition() -> None:
    defn = define(timeout=0.5, permissions=("math:use",))
    assert (defn.name, defn.input_model, defn.output_model, defn.timeout) == ("double", In, Out, 0.5)
    assert defn.description == "Double x." and defn.is_async and not defn.requires_idempotency_key
    assert defn.plugin == __name__


def test_a_title_is_optional_and_trimmed() -> None:
    assert define().title == ""
    assert define(title=" Double a number ").title == "Double a number"


def test_write_tools_require_keys() -> None:
    assert define(side_effect="internal_reversible").requires_idempotency_key


@pytest.mark.parametrize(("overrides", "field", "fragment"), [
    ({"name": "Double"}, "name", "lowercase"),
    ({"name": ""}, "name", "1-64"),
    ({"name": "a" * 65}, "name", "1-64"),
    ({"name": "-lead"}, "name", "inner"),
    ({"name": "trail_"}, "name", "inner"),
    ({"version": ""}, "version", "non-empty"),
    ({"timeout": 0}, "timeout", "positive"),
    ({"timeout": -1}, "timeout", "positive"),
    ({"timeout": float("inf")}, "timeout", "positive"),
    ({"side_effect": "sometimes"}, "side_effect", "unknown side effect 'sometimes'"),
    ({"permissions": ("",)}, "permissions", "non-empty strings"),
    ({"title": "Two\nlines"}, "title", "on one line"),
    ({"title": "x" * 129}, "title", "at most 128"),
    ({"retry": RetryPolicy(max_attempts=0)}, "retry", "at least 1"),
    ({"side_effect": "external_irreversible", "retry": RetryPolicy(max_attempts=3)}, "retry", "never retried"),
    ({"handler": untyped_input}, "input", "pydantic model"),
    ({"handler": untyped_output}, "output", "pydantic model"),
    ({"handler": three_params}, "handler", "exactly two"),
])
def test_invalid_definitions_name_the_field(overrides: dict[str, Any], field: str, fragment: str) -> None:
    handler = overrides.pop("handler", good)
    with pytest.raises(ToolDefinitionError) as info:
        define(handler, **overrides)
    assert info.value.field == field and info.value.plugin == __name__
    message = str(info.value)
    assert message.startswith(f"plugin {__name__!r}, tool ") and f"field {field!r}" in message
    assert fragment in message


def test_tool_error_defaults() -> None:
    error = ToolError("RATE_LIMITED", "slow down", field="q")
    assert error.code is ErrorCode.RATE_LIMITED and error.retryable is None and error.field == "q"
    with pytest.raises(ValueError):
        ToolError("NOT_A_CODE", "x")


def test_retry_backoff_is_capped() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.1, max_backoff=0.3)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]


def test_public_api_is_curated() -> None:
    import sidecar.client
    import sidecar.plugin

    assert sorted(sidecar.plugin.__all__) == ["ConfigError", "ErrorCode", "Partial", "Plugin", "PluginDefinitionError",
                                              "Principal", "Recovery", "RetryPolicy", "SENSITIVE", "SideEffect",
                                              "ToolContext", "ToolDefinition", "ToolDefinitionError", "ToolError",
                                              "default_state_dir", "read_plugin_settings", "tool"]
    assert sorted(sidecar.client.__all__) == ["AsyncClient", "Client", "ClientError", "ClientTls", "call_request"]
    for module in (sidecar.plugin, sidecar.client):
        assert all(hasattr(module, name) for name in module.__all__)


def test_plugins_written_against_the_older_modules_keep_working() -> None:
    import sidecar.contract
    import sidecar.masking
    import sidecar.plugin

    assert sidecar.masking.SENSITIVE is sidecar.plugin.SENSITIVE == {"sensitive": True}
    assert sidecar.contract.ErrorCode is sidecar.plugin.ErrorCode
    assert sidecar.contract.SideEffect is sidecar.plugin.SideEffect
