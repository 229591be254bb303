"""The history's facts and the decisions that read them: ``parse_decision``'s ``RATE_LIMITED``/``POLICY_VIOLATION``
and ``retry_after_seconds``; ``amount_of``, ``meter_entry``, ``label_entries``; a given history document
(``GivenHistory``) and what it gives a call; ``ErrorInfo.retry_after_seconds``."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import BaseModel

from sidecar.contract import RETRY_AFTER_SECONDS, CallRequest, ErrorCode, ErrorInfo, Principal, SideEffect
from sidecar.errors import CallRefused, MalformedDecisionError
from sidecar.pipeline.call import Arguments, Call
from sidecar.pipeline.history import EMPTY, MAX_AMOUNT, GivenHistory, amount_of, label_entries, meter_entry, recorded
from sidecar.policy import Decision, Stage, parse_decision
from sidecar.policy.decision import MAX_RETRY_AFTER_SECONDS
from sidecar.policy.history import HistoryNeeds, Meter, MeterKey
from sidecar.policy.input import CallInput
from sidecar.state import MeterCount
from sidecar.tools.definition import ToolContext, ToolDefinition, tool

RULE = "data.toolbooth.authz.decision"


# --- parse_decision ---------------------------------------------------------------------------------------


def test_a_rate_limited_denial_carries_when_to_retry() -> None:
    decision = parse_decision(Stage.AUTHZ, {"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": 12,
                                            "reason": "rate limit writes reached"})
    assert decision == Decision(allow=False, code=ErrorCode.RATE_LIMITED, reason="rate limit writes reached",
                                retry_after_seconds=12)
    assert decision.document() == {"code": ErrorCode.RATE_LIMITED, "reason": "rate limit writes reached",
                                   "retry_after_seconds": 12}
    assert json.loads(json.dumps(decision.document())) == {"code": "RATE_LIMITED",
                                                           "reason": "rate limit writes reached",
                                                           "retry_after_seconds": 12}


@pytest.mark.parametrize("retry", [1, MAX_RETRY_AFTER_SECONDS])
def test_retry_after_may_be_one_second_up_to_the_maximum(retry: int) -> None:
    decision = parse_decision(Stage.AUTHZ, {"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": retry})
    assert decision.retry_after_seconds == retry == decision.document()["retry_after_seconds"]
    assert MAX_RETRY_AFTER_SECONDS == 366 * 24 * 3600


def test_a_rate_limited_denial_need_not_say_when() -> None:
    decision = parse_decision(Stage.AUTHZ, {"allow": False, "code": "RATE_LIMITED"})
    assert decision.code is ErrorCode.RATE_LIMITED and decision.retry_after_seconds is None
    assert "retry_after_seconds" not in decision.document()


def test_a_policy_violation_is_a_denial_code() -> None:
    decision = parse_decision(Stage.AUTHZ, {"allow": False, "code": "POLICY_VIOLATION", "reason": "no exfiltration"})
    assert decision == Decision(allow=False, code=ErrorCode.POLICY_VIOLATION, reason="no exfiltration")
    assert decision.document() == {"code": ErrorCode.POLICY_VIOLATION, "reason": "no exfiltration"}


def test_the_deny_codes_are_named_when_one_is_unknown() -> None:
    with pytest.raises(MalformedDecisionError) as refused:
        parse_decision(Stage.AUTHZ, {"allow": False, "code": "TOO_MANY"})
    assert str(refused.value) == (f"{RULE}.code must be one of PERMISSION_DENIED, RESOURCE_NOT_FOUND, "
                                  "POLICY_VIOLATION, RATE_LIMITED or absent, got 'TOO_MANY'")


@pytest.mark.parametrize(("document", "message"), [
    ({"allow": False, "retry_after_seconds": 5},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got 5 with "
     "code None"),
    ({"allow": True, "retry_after_seconds": 5},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got 5 with "
     "code None"),
    ({"allow": False, "code": "PERMISSION_DENIED", "retry_after_seconds": 5},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got 5 with "
     "code 'PERMISSION_DENIED'"),
    ({"allow": False, "code": "POLICY_VIOLATION", "retry_after_seconds": 5},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got 5 with "
     "code 'POLICY_VIOLATION'"),
    ({"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": 0},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got 0 with "
     "code 'RATE_LIMITED'"),
    ({"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": -3},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got -3 with "
     "code 'RATE_LIMITED'"),
    ({"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": MAX_RETRY_AFTER_SECONDS + 1},
     f"{RULE}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with code RATE_LIMITED, got "
     f"{MAX_RETRY_AFTER_SECONDS + 1} with code 'RATE_LIMITED'"),
    ({"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": True},
     f"{RULE}.retry_after_seconds must be a whole number of seconds, got True"),
    ({"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": 1.5},
     f"{RULE}.retry_after_seconds must be a whole number of seconds, got 1.5"),
    ({"allow": False, "code": "RATE_LIMITED", "retry_after_seconds": "12"},
     f"{RULE}.retry_after_seconds must be a whole number of seconds, got '12'"),
])
def test_a_malformed_retry_after_is_refused(document: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedDecisionError) as refused:
        parse_decision(Stage.AUTHZ, document)
    assert str(refused.value) == message


def test_an_approval_decision_saying_when_to_retry_is_refused() -> None:
    with pytest.raises(MalformedDecisionError) as refused:
        parse_decision(Stage.APPROVAL, {"required": True, "retry_after_seconds": 5})
    assert str(refused.value).startswith("data.toolbooth.approval.decision.retry_after_seconds must be 1-")


# --- amount_of --------------------------------------------------------------------------------------------


class Anything(BaseModel):
    pass


def called(data: dict[str, Any], defn: ToolDefinition[Any, Any] | None = None,
           conversation_id: str | None = None) -> Call:
    """A call whose validated arguments are ``data`` (and whose tool is ``defn``, if given)."""
    request = CallRequest(tool="pay", arguments_json=json.dumps(data), conversation_id=conversation_id)
    call = Call(Principal(id="p1", tenant="acme"), request, "rev")
    if defn is not None:
        call.tool = defn
    call.arguments = Arguments(Anything(), data, frozenset(), CallInput.of(data, request), b"")
    return call


def summing(pointer: str | None, name: str = "spend") -> Meter:
    return Meter(name, (MeterKey.PRINCIPAL,), 60, sum=pointer)


ARGUMENTS = {
    "amount": 12.5,
    "whole": 7,
    "items": [{"price": 3}, {"price": 4}],
    "none": None,
    "nested": {"a/b": {"c~d": 9}, "~1": 2},
    "text": "12",
    "flag": True,
    "object": {"value": 1},
}


@pytest.mark.parametrize(("pointer", "amount"), [
    (None, 0.0),  # a meter without sum sums nothing
    ("/amount", 12.5),
    ("/whole", 7.0),
    ("/items", 2.0),  # a list: its length
    ("/items/1/price", 4.0),  # an array index
    ("/items/5/price", 0.0),  # past the end: absent
    ("/items/x", 0.0),
    ("/missing", 0.0),
    ("/missing/deeper", 0.0),
    ("/none", 0.0),  # null: absent
    ("/nested/a~1b/c~0d", 9.0),  # ~1 is "/", ~0 is "~"
    ("/nested/~01", 2.0),  # "~01" is "~1": ~1 is not unescaped before ~0
    ("/text/0", 0.0),  # into a string: absent
])
def test_what_a_call_adds_to_a_sum(pointer: str | None, amount: float) -> None:
    assert amount_of(summing(pointer), called(ARGUMENTS)) == amount


@pytest.mark.parametrize(("pointer", "kind"), [("/text", "str"), ("/object", "dict"), ("/flag", "bool")])
def test_a_value_that_cannot_be_summed_refuses_the_call(pointer: str, kind: str) -> None:
    with pytest.raises(CallRefused) as refused:
        amount_of(summing(pointer), called(ARGUMENTS))
    [error] = refused.value.errors
    assert error.code is ErrorCode.INTERNAL_ERROR and not error.retryable
    assert error.message == (f"meter 'spend' of the policy sums {pointer}, which must be a number or a list, "
                             f"not {kind}")


@pytest.mark.parametrize("amount", [MAX_AMOUNT + 2, 1e308, 2 ** 70])
def test_an_amount_a_sum_could_not_hold_refuses_the_call_as_an_invalid_argument(amount: float) -> None:
    with pytest.raises(CallRefused) as refused:
        amount_of(summing("/amount"), called({"amount": amount}))
    [error] = refused.value.errors
    assert error.code is ErrorCode.INVALID_ARGUMENT
    assert error.message == (f"/amount is {amount:g}, more than the policy's meter 'spend' can count "
                             "(at most 9.0072e+15)")
    assert amount_of(summing("/amount"), called({"amount": MAX_AMOUNT})) == MAX_AMOUNT


def test_an_index_that_is_not_ascii_digits_is_no_index() -> None:
    """``"²"`` is a digit to ``str.isdigit`` but no array index (RFC 6901: ASCII digits): the value is absent, or
    else the call is refused, never a ``ValueError`` out of the history stage."""
    try:
        amount = amount_of(summing("/items/\u00b2"), called(ARGUMENTS))
    except CallRefused as refused:
        assert refused.errors[0].code is ErrorCode.INTERNAL_ERROR
    else:
        assert amount == 0.0


# --- meter_entry ------------------------------------------------------------------------------------------


def test_a_meter_that_counted_nothing_says_retry_after_0() -> None:
    entry = meter_entry(summing(None), MeterCount(0, 0.0, None), 0.0, 1000.0)
    assert entry == {"count": 0, "sum": 0, "amount": 0, "window_seconds": 60, "retry_after_seconds": 0}
    assert all(type(entry[key]) is int for key in entry)


@pytest.mark.parametrize(("oldest", "now", "retry"), [
    (1000.0, 1000.0, 60),  # the oldest just counted: the whole window
    (1000.0, 1030.2, 30),  # 29.8 s left: rounded up
    (1000.0, 1059.5, 1),
    (1000.0, 1060.0, 1),  # at least 1
    (1000.0, 2000.0, 1),
    (1000.25, 1000.0, 60),  # counted ahead of this call, which asked earlier: never past the window
    (1500.0, 1000.0, 60),
])
def test_retry_after_is_when_the_oldest_counted_call_leaves_the_window(oldest: float, now: float,
                                                                       retry: int) -> None:
    entry = meter_entry(summing(None), MeterCount(3, 0.0, oldest), 0.0, now)
    assert entry["retry_after_seconds"] == retry and type(entry["retry_after_seconds"]) is int
    assert entry["retry_after_seconds"] == min(60, max(1, math.ceil(oldest + 60 - now)))
    assert entry["count"] == 3


def test_whole_sums_and_amounts_are_integers() -> None:
    whole = meter_entry(summing("/a"), MeterCount(2, 30.0, 10.0), 5.0, 20.0)
    assert (whole["sum"], whole["amount"]) == (30, 5)
    assert type(whole["sum"]) is int and type(whole["amount"]) is int
    fraction = meter_entry(summing("/a"), MeterCount(2, 30.5, 10.0), 0.25, 20.0)
    assert (fraction["sum"], fraction["amount"]) == (30.5, 0.25)
    assert json.dumps(whole) == ('{"count": 2, "sum": 30, "amount": 5, "window_seconds": 60, '
                                 '"retry_after_seconds": 50}')


# --- label_entries ----------------------------------------------------------------------------------------


def test_each_label_of_each_tool_once_at_its_first_time_in_order() -> None:
    rows = [("restricted", "read_document", "2026-11-30T14:00:00Z"),
            ("untrusted", "fetch_page", "2026-11-30T14:01:00Z"),
            ("restricted", "read_document", "2026-11-30T14:02:00Z"),
            ("restricted", "search_documents", "2026-11-30T14:03:00Z"),
            ("untrusted", "fetch_page", "2026-11-30T14:04:00Z")]
    assert label_entries(rows) == [
        {"label": "restricted", "tool": "read_document", "time": "2026-11-30T14:00:00Z"},
        {"label": "untrusted", "tool": "fetch_page", "time": "2026-11-30T14:01:00Z"},
        {"label": "restricted", "tool": "search_documents", "time": "2026-11-30T14:03:00Z"},
    ]
    assert label_entries([]) == []
    assert label_entries(iter(rows[:1])) == [
        {"label": "restricted", "tool": "read_document", "time": "2026-11-30T14:00:00Z"}]


# --- GivenHistory -----------------------------------------------------------------------------------------


FULL: dict[str, Any] = {
    "history": {
        "meters": {"writes": {"count": 30, "sum": 2.5, "amount": 1, "window_seconds": 60, "retry_after_seconds": 12}},
        "failures": [{"code": "RESOURCE_NOT_FOUND", "time": "2026-11-30T14:00:00Z"}],
    },
    "conversation": {"id": "c1", "labels": [{"label": "restricted", "tool": "read_document",
                                             "time": "2026-11-30T14:00:00Z"}]},
}


@pytest.mark.parametrize("document", [
    {},
    {"history": {}},
    {"conversation": {}},
    {"history": {"meters": {"writes": {}}}},
    {"history": {"meters": {"writes": {"count": 30, "retry_after_seconds": 12}}}},
    {"conversation": {"id": None, "labels": []}},
    FULL,
])
def test_a_valid_history_document_is_read_as_given(document: dict[str, Any]) -> None:
    assert GivenHistory.read(json.dumps(document)) == document


@pytest.mark.parametrize(("text", "problem"), [
    ("not json", "(top level): Invalid JSON"),
    ("", "(top level): Invalid JSON"),
    ("[]", "(top level): Input should be an object"),
    ("null", "(top level): Input should be an object"),
    ('{"meters": {}}', "meters: Extra inputs are not permitted"),
    ('{"history": {"labels": []}}', "history.labels: Extra inputs are not permitted"),
    ('{"history": {"meters": {"m": {"limit": 3}}}}', "history.meters.m.limit: Extra inputs are not permitted"),
    ('{"history": {"failures": [{"code": "X", "time": "t", "tool": "x"}]}}',
     "history.failures.0.tool: Extra inputs are not permitted"),
    ('{"conversation": {"labels": [], "tenant": "acme"}}', "conversation.tenant: Extra inputs are not permitted"),
    ('{"conversation": {"labels": [{"label": "a", "tool": "t", "time": "t", "why": 1}]}}',
     "conversation.labels.0.why: Extra inputs are not permitted"),
    ('{"history": {"meters": {"m": {"count": -1}}}}',
     "history.meters.m.count: Input should be greater than or equal to 0"),
    ('{"history": {"meters": {"m": {"retry_after_seconds": -1}}}}',
     "history.meters.m.retry_after_seconds: Input should be greater than or equal to 0"),
    ('{"history": {"meters": {"m": {"window_seconds": 0}}}}',
     "history.meters.m.window_seconds: Input should be greater than 0"),
    ('{"history": {"meters": {"m": {"count": "3"}}}}', "history.meters.m.count: Input should be a valid integer"),
    ('{"history": {"meters": {"m": {"count": true}}}}', "history.meters.m.count: Input should be a valid integer"),
    ('{"history": {"meters": []}}', "history.meters: Input should be an object"),
    ('{"history": {"meters": {"m": 3}}}', "history.meters.m: Input should be an object"),
    ('{"conversation": {"labels": [{"label": "restricted", "time": "t"}]}}',
     "conversation.labels.0.tool: Field required"),
    ('{"history": {"failures": [{"time": "t"}]}}', "history.failures.0.code: Field required"),
    ('{"history": {"failures": "RESOURCE_NOT_FOUND"}}', "history.failures: Input should be a valid array"),
    ('{"conversation": {"labels": "restricted"}}', "conversation.labels: Input should be a valid array"),
    ('{"conversation": {"labels": ["restricted"]}}', "conversation.labels.0: Input should be an object"),
    ('{"conversation": {"id": 7}}', "conversation.id: Input should be a valid string"),
])
def test_a_wrong_history_document_says_what_is_wrong_where(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        GivenHistory.read(text)
    assert str(refused.value).startswith(problem), str(refused.value)


def test_every_problem_of_a_history_document_is_named() -> None:
    with pytest.raises(ValueError) as refused:
        GivenHistory.read('{"history": {"failures": [{}]}, "conversation": {"labels": [{"label": 1}]}}')
    assert str(refused.value).split("; ") == [
        "history.failures.0.code: Field required", "history.failures.0.time: Field required",
        "conversation.labels.0.label: Input should be a valid string", "conversation.labels.0.tool: Field required",
        "conversation.labels.0.time: Field required"]


class Pay(BaseModel):
    amount: float


@tool(name="pay", version="1.0.0", side_effect=SideEffect.EXTERNAL_IRREVERSIBLE)
async def pay(args: Pay, ctx: ToolContext) -> Pay:
    return args


async def test_a_given_history_answers_what_the_policies_read() -> None:
    counted = Meter("writes", (MeterKey.PRINCIPAL,), 60)
    amounts = Meter("amounts", (MeterKey.PRINCIPAL,), 3600, sum="/amount")
    elsewhere = Meter("reads", (MeterKey.PRINCIPAL,), 60, side_effects=frozenset({SideEffect.NONE}))
    needs = HistoryNeeds((amounts, elsewhere, counted), labels=True, failures=True)
    given = GivenHistory(GivenHistory.read(json.dumps(FULL)))
    seen = await given.seen(called({"amount": 2.5}, pay, conversation_id="c9"), needs)
    assert seen.document == {
        "history": {
            "meters": {
                "amounts": {"count": 0, "sum": 0, "amount": 2.5, "window_seconds": 3600, "retry_after_seconds": 0},
                "writes": {"count": 30, "sum": 2.5, "amount": 1, "window_seconds": 60, "retry_after_seconds": 12},
            },
            "failures": FULL["history"]["failures"],
        },
        "conversation": {"id": "c9", "labels": FULL["conversation"]["labels"]},  # the call's conversation
    }
    assert json.loads("{" + seen.json + "}") == seen.document
    assert recorded({"history": seen.document}) == seen


async def test_a_given_history_gives_only_what_the_policies_read() -> None:
    given = GivenHistory(GivenHistory.read(json.dumps(FULL)))
    seen = await given.seen(called({"amount": 1}, pay), HistoryNeeds(labels=True))
    assert seen.document == {"history": {"meters": {}, "failures": []},
                             "conversation": {"id": None, "labels": FULL["conversation"]["labels"]}}
    nothing = await GivenHistory().seen(called({"amount": 1}, pay), HistoryNeeds(labels=True, failures=True))
    assert nothing.document == EMPTY.document


def test_a_trail_without_history_facts_recorded_none() -> None:
    assert recorded({}) is None
    assert recorded({"history": {"error": "the call history is unavailable"}}) is None
    assert recorded({"history": "nope"}) is None


# --- ErrorInfo.retry_after_seconds ------------------------------------------------------------------------


@pytest.mark.parametrize(("details", "retry"), [
    ({RETRY_AFTER_SECONDS: 12}, 12),
    ({RETRY_AFTER_SECONDS: 1, "other": "x"}, 1),
    ({RETRY_AFTER_SECONDS: True}, None),
    ({RETRY_AFTER_SECONDS: 0}, None),
    ({RETRY_AFTER_SECONDS: -5}, None),
    ({RETRY_AFTER_SECONDS: "12"}, None),
    ({RETRY_AFTER_SECONDS: 12.0}, None),
    ({RETRY_AFTER_SECONDS: None}, None),
    ({}, None),
    (None, None),
])
def test_an_error_says_when_to_retry_only_with_a_positive_whole_number(details: dict[str, Any] | None,
                                                                        retry: int | None) -> None:
    error = ErrorInfo.of(ErrorCode.RATE_LIMITED, "slow down", details=details)
    assert error.retry_after_seconds == retry
    assert RETRY_AFTER_SECONDS == "retry_after_seconds"
