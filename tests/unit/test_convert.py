"""Round trips between domain types and ``toolbooth.v1`` messages."""

from __future__ import annotations

from enum import Enum
from typing import Any

import pytest

from sidecar.api import convert
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.contract import (
    ApprovalResult,
    CallBatch,
    CallRequest,
    ErrorCode,
    ErrorInfo,
    Preview,
    PreviewState,
    Progress,
    Recovery,
    ResultMeta,
    SideEffect,
    Status,
    ToolDescriptor,
    ToolListing,
    ToolResult,
)

ENUM_PAIRS: list[tuple[type[Enum], Any, convert.EnumMap[Any, Any]]] = [
    (Status, pb.Status, convert.STATUS),
    (ErrorCode, pb.ErrorCode, convert.ERROR_CODE),
    (Recovery, pb.Recovery, convert.RECOVERY),
    (SideEffect, pb.SideEffect, convert.SIDE_EFFECT),
    (PreviewState, pb.PreviewState, convert.PREVIEW_STATE),
]


def _meta(**changes: object) -> ResultMeta:
    base = ResultMeta(request_id="r-1", tool="calculate", tool_version="1.0.0", duration_ms=12, attempt=1)
    return base.model_copy(update=changes)


@pytest.mark.parametrize(("domain", "proto", "mapping"), ENUM_PAIRS)
def test_every_domain_member_has_a_proto_value_of_the_same_name(
    domain: type[Enum], proto: Any, mapping: convert.EnumMap[Any, Any]
) -> None:
    prefix = proto.Name(0).removesuffix("UNSPECIFIED")
    for member in domain:
        assert proto.Name(mapping.to_pb(member)) == prefix + member.name
        assert mapping.from_pb(mapping.to_pb(member)) is member


@pytest.mark.parametrize(("domain", "proto", "mapping"), ENUM_PAIRS)
def test_every_proto_value_except_unspecified_has_a_domain_member(
    domain: type[Enum], proto: Any, mapping: convert.EnumMap[Any, Any]
) -> None:
    specified = [number for name, number in proto.items() if not name.endswith("_UNSPECIFIED")]
    assert {mapping.from_pb(number) for number in specified} == set(domain)
    assert len(specified) == len(domain)


@pytest.mark.parametrize("mapping", [pair[2] for pair in ENUM_PAIRS])
def test_unspecified_and_unknown_values_are_rejected(mapping: convert.EnumMap[Any, Any]) -> None:
    for number in (0, 999):
        with pytest.raises(ValueError, match=f"value {number}"):
            mapping.from_pb(number)


def test_success_result_round_trips_with_compact_json_data() -> None:
    result = ToolResult(status=Status.SUCCESS, data={"sum": 3, "text": "é"}, meta=_meta(policy_revision="rev-7"))
    message = convert.result_to_pb(result)
    assert message.status == pb.STATUS_SUCCESS
    assert message.data_json == '{"sum":3,"text":"é"}'
    assert not message.HasField("error")
    assert convert.result_from_pb(pb.ToolResult.FromString(message.SerializeToString())) == result


def test_error_result_round_trips_every_error_and_field() -> None:
    first = ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "must be a number", field="operands.1")
    second = ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "field required", field="op")
    result = ToolResult(status=Status.ERROR, error=first, errors=(first, second), meta=_meta(attempt=0))
    message = convert.result_to_pb(result)
    assert message.error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert message.error.recovery == pb.RECOVERY_CORRECT_ARGUMENTS
    assert message.error.field == "operands.1"
    assert convert.result_from_pb(message) == result


PREVIEW = Preview(preview_id="p-1", preview_hash="sha256:ab", call_json='{"tool":"file_note"}', reason="why",
                  expires_at="2026-11-30T15:15:00Z", approver_roles=("approver", "security"))


def test_approval_required_result_round_trips_its_preview() -> None:
    error = ErrorInfo.of(ErrorCode.APPROVAL_REQUIRED, "why")
    result = ToolResult(status=Status.APPROVAL_REQUIRED, error=error, errors=(error,), meta=_meta(), preview=PREVIEW)
    message = convert.result_to_pb(result)
    assert message.preview.state == pb.PREVIEW_STATE_PENDING and message.preview.decided_by == ""
    assert convert.result_from_pb(pb.ToolResult.FromString(message.SerializeToString())) == result
    assert not convert.result_to_pb(result.model_copy(update={"preview": None})).HasField("preview")


def test_approval_result_round_trips() -> None:
    decided = PREVIEW.model_copy(update={"state": PreviewState.APPROVED, "decided_by": "bob",
                                         "decided_at": "2026-11-30T15:01:00Z", "comment": "ok"})
    for result in (ApprovalResult(ok=True, preview=decided),
                   ApprovalResult(ok=False, error=ErrorInfo.of(ErrorCode.PREVIEW_EXPIRED, "expired")),
                   ApprovalResult(ok=False, error=ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, "x"), preview=PREVIEW)):
        assert convert.approval_from_pb(convert.approval_to_pb(result)) == result


def test_none_fields_travel_as_empty_strings() -> None:
    error = ErrorInfo.of(ErrorCode.TIMEOUT, "took too long", side_effect=SideEffect.EXTERNAL_REVERSIBLE)
    result = ToolResult(status=Status.ERROR, error=error, errors=(error,), meta=_meta())
    message = convert.result_to_pb(result)
    assert (message.data_json, message.error.field) == ("", "")
    assert message.error.recovery == pb.RECOVERY_CHECK_OPERATION_STATUS
    assert convert.result_from_pb(message).error == error


def test_meta_flags_round_trip() -> None:
    meta = _meta(idempotency_replayed=True, truncated=True, policy_revision="abc")
    assert convert.meta_from_pb(convert.meta_to_pb(meta)) == meta


def test_every_meta_field_travels() -> None:
    """Each field of ``ResultMeta``, set to something other than its default, survives the proto and back."""
    others: dict[type, object] = {str: "x", int: 7, bool: True}
    for name, field in ResultMeta.model_fields.items():
        annotation = str(field.annotation)
        kind = next(kind for kind in others if kind is field.annotation or f"{kind.__name__} |" in annotation)
        meta = _meta(**{name: others[kind]})
        assert getattr(meta, name) != field.default
        assert convert.meta_from_pb(convert.meta_to_pb(meta)) == meta, name


def test_listing_round_trips_with_schema_as_json() -> None:
    descriptor = ToolDescriptor(
        name="send_email",
        version="2.1.0",
        description="Send one email.",
        input_schema={"type": "object", "properties": {"to": {"type": "string"}}},
        side_effect=SideEffect.EXTERNAL_IRREVERSIBLE,
        requires_idempotency_key=True,
        timeout_ms=5000,
        output_schema={"type": "object", "properties": {"sent": {"type": "boolean"}}},
        title="Send email",
    )
    listing = ToolListing(tools=(descriptor,), policy_revision="rev-1")
    message = convert.listing_to_pb(listing)
    assert message.tools[0].side_effect == pb.SIDE_EFFECT_EXTERNAL_IRREVERSIBLE
    assert message.tools[0].input_schema_json == '{"type":"object","properties":{"to":{"type":"string"}}}'
    assert message.tools[0].output_schema_json == '{"type":"object","properties":{"sent":{"type":"boolean"}}}'
    assert message.tools[0].title == "Send email"
    assert convert.listing_from_pb(message) == listing


def test_a_descriptor_without_output_schema_or_title_round_trips_empty() -> None:
    """A sidecar that sends neither (built before them) reads as an empty schema and no title."""
    message = pb.ToolDescriptor(name="t", version="1", input_schema_json="{}", side_effect=pb.SIDE_EFFECT_NONE)
    descriptor = convert.descriptor_from_pb(message)
    assert (descriptor.output_schema, descriptor.title) == ({}, "")
    assert convert.descriptor_to_pb(descriptor).output_schema_json == ""


def test_a_descriptor_is_converted_once_and_an_equal_one_of_its_own() -> None:
    """A registry's descriptors are listed again and again: the same object gives the same message; another
    object, even an equal one, is converted from its own fields (the cache is by identity, never by value)."""
    first = ToolDescriptor(name="t", version="1", description="", input_schema={"type": "object"},
                           side_effect=SideEffect.NONE, requires_idempotency_key=False, timeout_ms=1000)
    assert convert.descriptor_to_pb(first) is convert.descriptor_to_pb(first)
    other = first.model_copy(update={"input_schema": {"type": "object", "required": ["a"]}})
    assert convert.descriptor_to_pb(other).input_schema_json == '{"type":"object","required":["a"]}'
    equal = first.model_copy()
    assert convert.descriptor_to_pb(equal) is not convert.descriptor_to_pb(first)
    assert convert.descriptor_to_pb(equal) == convert.descriptor_to_pb(first)


def test_empty_listing_round_trips() -> None:
    listing = ToolListing(tools=(), policy_revision="")
    assert convert.listing_from_pb(convert.listing_to_pb(listing)) == listing


def test_call_request_empty_strings_become_none() -> None:
    message = pb.ExecuteToolRequest(tool="calculate", arguments_json='{"a":1}', call_id="c-9")
    request = convert.call_request_from_pb(message)
    assert request == CallRequest(tool="calculate", arguments_json='{"a":1}', call_id="c-9")
    assert request.idempotency_key is None and request.approval_id is None and request.conversation_id is None


def test_call_request_round_trips_every_field() -> None:
    request = CallRequest(
        tool="send_email",
        arguments_json="{}",
        idempotency_key="k-1",
        approval_id="a-1",
        conversation_id="conv-1",
        call_id="call-1",
    )
    assert convert.call_request_from_pb(convert.call_request_to_pb(request)) == request


def test_call_request_without_options_serializes_empty_strings() -> None:
    message = convert.call_request_to_pb(CallRequest(tool="calculate"))
    assert message == pb.ExecuteToolRequest(tool="calculate")


def test_batch_round_trips_every_call_and_option() -> None:
    batch = CallBatch(calls=(CallRequest(tool="echo", arguments_json='{"text":"a"}', call_id="c-1"),
                             CallRequest(tool="create_note", idempotency_key="k-1")),
                      max_concurrency=3, cancel_on_permanent_failure=True)
    message = convert.batch_to_pb(batch)
    assert (len(message.calls), message.max_concurrency, message.cancel_on_permanent_failure) == (2, 3, True)
    assert convert.batch_from_pb(message) == batch


def test_batch_results_round_trip_in_order() -> None:
    results = (ToolResult(status=Status.SUCCESS, data={"n": 1}, meta=_meta(request_id="r-1")),
               ToolResult(status=Status.ERROR, error=ErrorInfo.of(ErrorCode.CANCELLED, "cancelled"),
                          errors=(ErrorInfo.of(ErrorCode.CANCELLED, "cancelled"),), meta=_meta(request_id="r-2")))
    assert tuple(convert.batch_results_from_pb(convert.batch_results_to_pb(results))) == results


@pytest.mark.parametrize("update", [Progress(progress=3, total=10, message="three"), Progress(progress=0.5),
                                    Progress(progress=0, total=0)])
def test_progress_events_round_trip_with_an_absent_total_kept_absent(update: Progress) -> None:
    message = convert.event_to_pb(update)
    assert message.WhichOneof("event") == "progress"
    assert message.progress.HasField("total") is (update.total is not None)
    assert convert.event_from_pb(message) == update


def test_a_result_event_round_trips_and_an_empty_event_is_refused() -> None:
    result = ToolResult(status=Status.SUCCESS, data=[1], meta=_meta())
    assert convert.event_from_pb(convert.event_to_pb(result)) == result
    with pytest.raises(ValueError, match="neither progress nor result"):
        convert.event_from_pb(pb.ToolEvent())
