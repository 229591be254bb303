"""A meter's ``facts``: what a call's input shows of a meter with a limit (``shown``), from the store and from a given
history; and that a meter showing only whether its limit is reached keeps its decisions in the decision cache while
its limit still holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.contract import ErrorCode
from sidecar.pipeline.history import GivenHistory, meter_entry, shown
from sidecar.policy import Stage
from sidecar.policy.cache import CachingEngine
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.history import HistoryNeeds, Meter, MeterFacts, MeterKey
from sidecar.state import MeterCount
from tests.conftest import PipelineFactory
from tests.support.history import with_meters
from tests.unit.test_history_decisions import called, pay
from tests.unit.test_pipeline import call
from tests.unit.test_policy_reads import Counting


def limited(limit: float, facts: MeterFacts = MeterFacts.COUNTS, pointer: str | None = None) -> Meter:
    return Meter("m", (MeterKey.PRINCIPAL,), 60, sum=pointer, limit=limit, facts=facts)


def counts(count: int, total: float = 0, amount: float = 0) -> dict[str, Any]:
    return {"count": count, "sum": total, "amount": amount, "window_seconds": 60, "retry_after_seconds": 7}


def test_a_meter_without_a_limit_shows_its_counts_as_they_are() -> None:
    assert shown(Meter("m", (MeterKey.PRINCIPAL,), 60), counts(5)) == counts(5)


@pytest.mark.parametrize(("count", "reached"), [(0, False), (2, False), (3, True), (9, True)])
def test_a_counting_meter_is_reached_at_its_limit(count: int, reached: bool) -> None:
    assert shown(limited(3), counts(count)) == {**counts(count), "reached": reached}


@pytest.mark.parametrize(("total", "amount", "reached"), [(0, 10, False), (4, 6, False), (4, 6.5, True),
                                                         (11, 0, True)])
def test_a_summing_meter_is_reached_when_this_call_would_pass_its_limit(total: float, amount: float,
                                                                       reached: bool) -> None:
    assert shown(limited(10, pointer="/a"), counts(99, total, amount))["reached"] is reached


def test_a_meter_showing_reached_hides_its_counts_below_its_limit_only() -> None:
    meter = limited(3, MeterFacts.REACHED)
    assert shown(meter, counts(2)) == {"reached": False}
    assert shown(meter, counts(3)) == {**counts(3), "reached": True}
    assert meter_entry(meter, MeterCount(1, 0.0, 990.0), 0.0, 1000.0) == {"reached": False}
    assert meter_entry(meter, MeterCount(3, 0.0, 990.0), 0.0, 1000.0) == {
        "count": 3, "sum": 0, "amount": 0, "window_seconds": 60, "retry_after_seconds": 50, "reached": True}


@pytest.mark.parametrize(("given", "entry"), [
    ({}, {"reached": False}),
    ({"count": 2}, {"reached": False}),
    ({"count": 3, "retry_after_seconds": 9}, {**counts(3), "retry_after_seconds": 9, "reached": True}),
    ({"reached": False}, {"reached": False}),
    ({"reached": True}, {**counts(0), "retry_after_seconds": 0, "reached": True}),
    ({"count": 5, "reached": False}, {"reached": False}),  # as given: the test of a policy decides
])
async def test_a_given_history_shows_a_meter_as_the_sidecar_would(given: dict[str, Any],
                                                                  entry: dict[str, Any]) -> None:
    document = GivenHistory.read(json.dumps({"history": {"meters": {"m": given}}}))
    needs = HistoryNeeds((limited(3, MeterFacts.REACHED),))
    seen = await GivenHistory(document).seen(called({"amount": 2.5}, pay), needs)
    assert seen.document["history"]["meters"] == {"m": entry}


async def test_a_given_counting_meter_says_whether_it_is_reached() -> None:
    document = GivenHistory.read(json.dumps({"history": {"meters": {"m": {"count": 4}}}}))
    seen = await GivenHistory(document).seen(called({"amount": 1}, pay), HistoryNeeds((limited(3),)))
    assert seen.document["history"]["meters"]["m"]["reached"] is True


async def test_below_its_limit_a_reached_meter_keeps_the_decision_cached_and_the_limit_holds(
        make_pipeline: PipelineFactory, tmp_path: Path) -> None:
    policies = with_meters(tmp_path / "policies", {"calls": {"by": ["principal"], "window_seconds": 60,
                                                             "limit": 3, "facts": "reached"}})
    counting = Counting(EmbeddedEngine.load(policies))
    pipeline = await make_pipeline(policy=CachingEngine(counting, max_entries=100, ttl_seconds=60))
    results = [await call(pipeline, "echo", {"text": "same"}, conversation_id="c") for _ in range(5)]
    assert [result.error.code if result.error else None for result in results] == [
        None, None, None, ErrorCode.RATE_LIMITED, ErrorCode.RATE_LIMITED]
    assert counting.made[Stage.AUTHZ] == 2  # once below the limit, once at it (its count stays: refusals use none)
    assert counting.inputs[Stage.AUTHZ]["history"]["meters"]["calls"]["count"] == 3  # type: ignore[index]
