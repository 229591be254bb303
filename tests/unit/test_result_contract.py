"""The handler's side of the result contract: ``ToolError`` with safe details, ``Partial``, page fields, retries
with attempt timeouts and preview renderers, each checked where a plugin author meets it; and the new fields
on the wire."""

from __future__ import annotations

import asyncio
import logging
import pickle
import re
import time
from typing import Any

import pytest
from pydantic import BaseModel

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.contract import ErrorCode, ErrorInfo, Preview, Principal, ResultMeta, Status, ToolResult
from sidecar.plugin import Partial, RetryPolicy, SideEffect, ToolContext, ToolDefinitionError, ToolError, tool
from sidecar.tools import preview
from sidecar.tools.isolation.protocol import Request
from sidecar.tools.isolation.worker import _run
from sidecar.tools.outcomes import MAX_SAFE_DETAILS_BYTES


class In(BaseModel):
    x: int


class Out(BaseModel):
    y: int


class Paged(BaseModel):
    items: list[int]
    next_cursor: str | None = None
    has_more: bool = False
    truncated: bool = False


def define(handler: Any = None, **overrides: Any) -> Any:
    async def handle(args: In, ctx: ToolContext) -> Out:
        return Out(y=args.x)

    options: dict[str, Any] = {"name": "t", "version": "1.0.0", "side_effect": SideEffect.NONE}
    return tool(**(options | overrides))(handler or handle)


def context(**changes: Any) -> ToolContext:
    fields: dict[str, Any] = {"principal": Principal(id="u1"), "request_id": "r-1", "deadline": time.monotonic() + 5,
                              "idempotency_key": None, "attempt": 1,
                              "logger": logging.LoggerAdapter(logging.getLogger("test"), {})}
    return ToolContext(**(fields | changes))


def test_safe_details_are_a_bounded_copy_of_json_values() -> None:
    details = {"rejected": [{"email": "a@x.test", "reason": "550"}]}
    error = ToolError(ErrorCode.PARTIAL_DELIVERY, "refused", safe_details=details)
    details["rejected"].append({"email": "later"})  # the error keeps what it was given
    assert error.safe_details == {"rejected": [{"email": "a@x.test", "reason": "550"}]}
    assert ToolError("POLICY_VIOLATION", "no").code is ErrorCode.POLICY_VIOLATION


@pytest.mark.parametrize(("details", "message"), [
    (["a"], "must be a dict with string keys, got list"),
    ({1: "a"}, "must be a dict with string keys"),
    ({"when": time}, "JSON values only"),
    ({"ratio": float("nan")}, "JSON values only"),
    ({"big": 2**60}, "JSON values only"),
    ({"blob": "x" * MAX_SAFE_DETAILS_BYTES}, f"above the limit of {MAX_SAFE_DETAILS_BYTES}"),
])
def test_bad_safe_details_are_refused_with_a_clear_message(details: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ToolError(ErrorCode.POLICY_VIOLATION, "no", safe_details=details)


def test_tool_errors_and_partials_pickle_by_keyword() -> None:
    error = ToolError(ErrorCode.PARTIAL_DELIVERY, "refused", field="to", retryable=False, safe_details={"n": 1})
    partial = pickle.loads(pickle.dumps(Partial(Out(y=1), errors=[error])))
    [copy] = partial.errors
    assert (copy.code, copy.message, copy.field, copy.retryable, copy.safe_details) == (
        ErrorCode.PARTIAL_DELIVERY, "refused", "to", False, {"n": 1})
    assert partial.output == Out(y=1)


@pytest.mark.parametrize("errors", [[], [ValueError("x")], ["text"]])
def test_a_partial_needs_tool_errors(errors: list[Any]) -> None:
    with pytest.raises(ValueError, match="at least one ToolError"):
        Partial(Out(y=1), errors=errors)


def test_a_handler_may_return_a_partial() -> None:
    async def both(args: In, ctx: ToolContext) -> Out | Partial[Out]:
        return Out(y=1)

    async def only(args: In, ctx: ToolContext) -> Partial[Out]:
        return Partial(Out(y=1), errors=[ToolError(ErrorCode.TIMEOUT, "later")])

    assert define(both).output_model is Out and define(only).output_model is Out


class Other(BaseModel):
    z: int


class Wrong(BaseModel):
    has_more: int


@pytest.mark.parametrize("returned", [Out | Other, Partial[Other] | Out, int | Partial[Out]])
def test_a_return_annotation_must_name_one_output_model(returned: Any) -> None:
    async def handler(args: In, ctx: ToolContext) -> Out:
        return Out(y=1)

    handler.__annotations__["return"] = returned
    with pytest.raises(ToolDefinitionError, match="field 'output': return type must be a pydantic model Out"):
        define(handler)


def test_page_fields_are_mirrored_only_with_their_meta_types() -> None:
    async def paged(args: In, ctx: ToolContext) -> Paged:
        return Paged(items=[])

    assert define(paged).page_fields == ("next_cursor", "has_more", "truncated")
    assert define().page_fields == ()

    async def wrong(args: In, ctx: ToolContext) -> Wrong:
        return Wrong(has_more=1)

    with pytest.raises(ToolDefinitionError, match=re.escape("field 'has_more' is mirrored into the result's meta, "
                                                            "so it must be bool, got <class 'int'>")):
        define(wrong)


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"retry": RetryPolicy(max_attempts=2, attempt_timeout=0)}, "attempt_timeout must be a positive number"),
    ({"timeout": 1, "retry": RetryPolicy(max_attempts=2, attempt_timeout=2)}, "up to the tool's timeout (1)"),
    ({"side_effect": "internal_reversible", "retry": RetryPolicy(attempt_timeout=1)}, "never retried"),
    ({"preview": lambda args: None}, "field 'preview': must be a function taking exactly two"),
    ({"preview": "render"}, "field 'preview'"),
])
def test_bad_retry_and_preview_definitions_name_the_field(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ToolDefinitionError, match=re.escape(fragment)):
        define(**overrides)


def test_retry_on_takes_any_collection_of_codes() -> None:
    policy = RetryPolicy(max_attempts=2, attempt_timeout=1.0, retry_on=("TIMEOUT", ErrorCode.SERVICE_UNAVAILABLE))
    assert policy.retry_on == frozenset({ErrorCode.TIMEOUT, ErrorCode.SERVICE_UNAVAILABLE})
    assert define(retry=policy).retry.attempt_timeout == 1.0


@pytest.mark.parametrize(("rendered", "code"), [
    ({"to": ["a@x.test"], "n": 1.5}, None),
    (Out(y=3), None),
    (["not", "an", "object"], ErrorCode.INTERNAL_ERROR),
    ({"ratio": float("inf")}, ErrorCode.INTERNAL_ERROR),
    ({"body": "x" * preview.MAX_RENDERING_BYTES}, ErrorCode.INTERNAL_ERROR),
])
async def test_a_rendering_is_a_bounded_json_object(rendered: Any, code: ErrorCode | None) -> None:
    def render(args: In, ctx: ToolContext) -> Any:
        return rendered

    result = await preview.render(define(preview=render), In(x=1), context())
    if code is None:
        assert result == (rendered.model_dump() if isinstance(rendered, BaseModel) else rendered)
    else:
        assert isinstance(result, ErrorInfo) and result.code is code and "could not render" in result.message


async def test_a_renderer_that_hangs_ends_the_call_with_timeout() -> None:
    async def render(args: In, ctx: ToolContext) -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    result = await preview.render(define(preview=render), In(x=1), context(deadline=time.monotonic() + 0.05))
    assert isinstance(result, ErrorInfo) and result.code is ErrorCode.TIMEOUT


def test_an_isolated_handler_gets_the_approved_rendering() -> None:
    seen: list[Any] = []

    def handler(args: In, ctx: ToolContext) -> Out:
        seen.append(ctx.approved_preview)
        return Out(y=args.x)

    request = Request("t", In(x=1), Principal(id="u1"), "r-1", 5.0, "k-1", 1, "test", {}, {"to": ["a@x.test"]})
    assert _run(handler, request).value == Out(y=1)  # type: ignore[union-attr]
    assert seen == [{"to": ["a@x.test"]}]


def test_the_new_fields_round_trip_on_the_wire() -> None:
    error = ErrorInfo.of(ErrorCode.PARTIAL_DELIVERY, "refused", details={"rejected": ["é@x.test"]})
    meta = ResultMeta(request_id="r", tool="t", truncated=True, next_cursor="c-2", has_more=True)
    result = ToolResult(status=Status.PARTIAL_SUCCESS, data={"sent": 1}, errors=(error,), meta=meta)
    message = convert.result_to_pb(result)
    assert message.errors[0].details_json == '{"rejected":["é@x.test"]}' and not message.HasField("error")
    assert (message.meta.next_cursor, message.meta.has_more) == ("c-2", True)
    assert convert.result_from_pb(pb.ToolResult.FromString(message.SerializeToString())) == result
    plain = ToolResult(status=Status.SUCCESS, meta=ResultMeta(request_id="r", tool="t"))
    assert convert.result_from_pb(convert.result_to_pb(plain)) == plain  # no cursor: None, not ""
    shown = Preview(preview_id="p", preview_hash="sha256:ab", call_json="{}", reason="r", expires_at="e",
                    rendering_json='{"to":["a@x.test"]}')
    assert convert.preview_from_pb(convert.preview_to_pb(shown)) == shown
    bare = shown.model_copy(update={"rendering_json": None})
    assert convert.preview_to_pb(bare).rendering_json == "" and convert.preview_from_pb(
        convert.preview_to_pb(bare)) == bare
