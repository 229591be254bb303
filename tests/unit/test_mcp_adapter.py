"""The MCP adapter's pure parts: a ``tools/call`` as a ``CallRequest``, a ``ToolResult`` as a ``CallToolResult``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp_types import jsonrpc_message_adapter

from sidecar.contract import CallRequest, ErrorCode, ErrorInfo, ResultMeta, Status, ToolResult
from sidecar.errors import AuthenticationError, DependencyError, InvalidRequestError
from sidecar.mcp.meta import META_KEYS, call_request, conversation_id
from sidecar.mcp.results import call_result
from sidecar.mcp.server import protocol_error
from sidecar.server.mcp_transport import asks_for_progress


def test_the_meta_keys_fill_the_calls_own_fields() -> None:
    meta = {"toolbooth/idempotency_key": "k-1", "toolbooth/approval_id": "p-1", "toolbooth/call_id": "c-1",
            "toolbooth/conversation_id": "conv-1", "progressToken": 7, "other/key": {"ignored": True}}
    assert call_request("echo", {"text": "é"}, meta) == CallRequest(
        tool="echo", arguments_json='{"text":"é"}', idempotency_key="k-1", approval_id="p-1", call_id="c-1",
        conversation_id="conv-1")
    assert dict(META_KEYS) == {"idempotency_key": "toolbooth/idempotency_key", "approval_id": "toolbooth/approval_id",
                               "call_id": "toolbooth/call_id", "conversation_id": "toolbooth/conversation_id"}


def test_no_arguments_and_no_meta_are_an_empty_call() -> None:
    assert call_request("echo", None, None) == CallRequest(tool="echo", arguments_json="{}")
    assert call_request("echo", {}, {"toolbooth/idempotency_key": ""}).idempotency_key is None
    assert conversation_id(None) is None and conversation_id({"toolbooth/conversation_id": "c"}) == "c"


@pytest.mark.parametrize("value", [7, ["k"], {"k": 1}, True])
def test_a_meta_value_that_is_not_a_string_breaks_the_request(value: Any) -> None:
    with pytest.raises(InvalidRequestError, match=r"^_meta toolbooth/idempotency_key must be a string$"):
        call_request("create_note", {}, {"toolbooth/idempotency_key": value})


def test_arguments_too_deep_to_write_are_a_broken_request() -> None:
    deep: dict[str, Any] = {}
    for _ in range(100_000):
        deep = {"a": deep}
    with pytest.raises(InvalidRequestError, match=r"^arguments are nested too deeply$"):
        call_request("nested", deep, None)


def test_arguments_the_pipeline_must_refuse_are_passed_as_written() -> None:
    """NaN and lone surrogates are the pipeline's to refuse (and audit), not the adapter's to hide."""
    assert call_request("nested", {"x": float("nan"), "s": "\ud800"}, None).arguments_json == '{"x":NaN,"s":"\ud800"}'


META = ResultMeta(request_id="r-1", tool="echo")


@pytest.mark.parametrize(("status", "is_error"), [
    (Status.SUCCESS, False), (Status.PARTIAL_SUCCESS, False), (Status.ERROR, True), (Status.APPROVAL_REQUIRED, True),
])
def test_the_typed_result_is_the_structured_content_and_its_text(status: Status, is_error: bool) -> None:
    errors = () if status in (Status.SUCCESS, Status.PARTIAL_SUCCESS) else (
        ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "bad", field="text"),)
    result = ToolResult(status=status, data={"n": 1} if not errors else None, error=errors[0] if errors else None,
                        errors=errors, meta=META)
    answer = call_result(result)
    assert answer.is_error is is_error
    assert answer.structured_content == result.model_dump(mode="json")
    assert ToolResult.model_validate(answer.structured_content) == result
    assert json.loads(answer.content[0].text) == answer.structured_content  # type: ignore[union-attr]


def test_failures_outside_a_call_are_json_rpc_errors_with_constant_messages() -> None:
    assert (protocol_error(AuthenticationError("token expired")).error.message) == "unauthenticated: token expired"
    assert protocol_error(InvalidRequestError("tool is required")).error.code == -32602
    unavailable = protocol_error(DependencyError("db at 10.0.0.5 refused: password authentication failed"))
    assert (unavailable.error.code, unavailable.error.message) == (-32603, "service unavailable")


@pytest.mark.parametrize(("body", "asks"), [
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"t"}}}', True),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":0}}}', True),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":true}}}', False),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"toolbooth/call_id":"c"}}}', False),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', False),
    (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', False),
])
def test_only_a_request_with_a_progress_token_is_answered_as_an_event_stream(body: bytes, asks: bool) -> None:
    assert asks_for_progress(jsonrpc_message_adapter.validate_json(body)) is asks
