"""A call's history as its policies see it (``input.history``, ``input.conversation``), and where it comes from.

``Seen`` is what the history stage learned for one call: the facts its decisions read — the meters that apply to it
(``count``, ``sum``, ``amount``, ``window_seconds``, ``retry_after_seconds``), the earlier failures of the same
call in its conversation, and the labels of the conversation — as one JSON document, which the audit log records
(``call.trail["history"]``) so that ``toolbooth policy replay`` decides on exactly what the call saw.

A ``HistorySource`` gives a call its ``Seen`` and settles it once the call ended: ``StoreHistory`` (the sidecar's,
``sidecar.pipeline.stored_history``) counts in the store and reserves the call's place on its meters;
``GivenHistory`` answers from a given document (``toolbooth policy eval --history``, replay) and stores nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar.contract import ErrorCode, ErrorInfo, ToolResult
from sidecar.errors import CallRefused
from sidecar.pipeline.call import Call, Reservation, Seen
from sidecar.policy.decision import Stage
from sidecar.policy.history import HistoryNeeds, Meter, MeterFacts
from sidecar.policy.input import dumps
from sidecar.policy.reads import ALL_MEMBERS
from sidecar.state import MeterCount

__all__ = ["EMPTY", "MAX_AMOUNT", "READ_KEY", "TRAIL_KEY", "GivenHistory", "HistorySource", "Reservation", "Seen",
           "amount_of", "label_entries", "members_read", "meter_entry", "read_by", "recorded", "shown"]


EMPTY = Seen.of({}, [], None, [])
MAX_AMOUNT = 2.0 ** 53  # what one call may add to a meter's sum, at most: an integer a double holds exactly
TRAIL_KEY = "history"  # the call's trail entry of the facts its decisions saw (or of the failure to get them)
READ_KEY = "history_read"  # the call's trail entry of the members each decision got, where one got fewer than all


def read_by(needs: HistoryNeeds) -> dict[str, list[str]]:
    """``call.trail[READ_KEY]``: the members of the history each decision got, for those that got fewer than all."""
    return {stage.value: sorted(members) for stage, members in needs.reads or () if members != ALL_MEMBERS}


def members_read(trail: Mapping[str, Any], stage: Stage) -> frozenset[str]:
    """The members of the history ``stage``'s decision got, as the call's trail records it."""
    read = trail.get(READ_KEY)
    members = read.get(stage.value) if isinstance(read, dict) else None
    return ALL_MEMBERS if members is None else frozenset(members)


def recorded(trail: Mapping[str, Any]) -> Seen | None:
    """The facts a call's trail (``call.trail``, as the audit log keeps it) says its decisions saw, if any."""
    document = trail.get(TRAIL_KEY)
    if not isinstance(document, dict) or "error" in document:
        return None
    return Seen(document, dumps(document)[1:-1])


class HistorySource(Protocol):
    """Where a call's history comes from (``sidecar.pipeline.stages.history``)."""

    async def seen(self, call: Call, needs: HistoryNeeds) -> Seen:
        """The facts ``needs`` asks for, for ``call`` (validated); ``CallRefused`` when they cannot be had."""
        ...

    async def settle(self, call: Call, needs: HistoryNeeds, seen: Seen, result: ToolResult) -> ToolResult:
        """Record what the ended call adds to the history ``needs`` asks for (or give its meter places back if it
        did not run); the result its caller gets."""
        ...

    def abandon(self, call: Call, seen: Seen) -> None:
        """The caller of ``call`` went away: give its meter places back soon if it did not run."""
        ...

    async def aclose(self) -> None:
        """Finish what was started in the background."""
        ...


class _Given(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _MeterGiven(_Given):
    reached: bool = False
    count: int = Field(default=0, ge=0)
    sum: int | float = 0
    amount: int | float = 0
    window_seconds: int = Field(default=1, gt=0)
    retry_after_seconds: int = Field(default=0, ge=0)


class _Failure(_Given):
    code: str
    time: str


class _Label(_Given):
    label: str
    tool: str
    time: str


class _HistoryGiven(_Given):
    meters: dict[str, _MeterGiven] = {}
    failures: list[_Failure] = []


class _ConversationGiven(_Given):
    id: str | None = None
    labels: list[_Label] = []


class _Document(_Given):
    history: _HistoryGiven = _HistoryGiven()
    conversation: _ConversationGiven = _ConversationGiven()


class GivenHistory:
    """The history of a given document, as ``Seen.document`` has it (missing parts: none); stores nothing."""

    @classmethod
    def read(cls, text: str) -> dict[str, Any]:
        """A given history document (JSON text) checked: ``ValueError`` saying what is wrong where."""
        try:
            return _Document.model_validate_json(text).model_dump(exclude_unset=True)
        except ValidationError as exc:
            raise ValueError("; ".join(f"{'.'.join(map(str, error['loc'])) or '(top level)'}: {error['msg']}"
                                       for error in exc.errors())) from None

    def __init__(self, document: Mapping[str, Any] | None = None) -> None:
        given = document or {}
        self._meters: Mapping[str, Any] = given.get("history", {}).get("meters", {})
        self._failures: list[dict[str, Any]] = list(given.get("history", {}).get("failures", []))
        self._labels: list[dict[str, Any]] = list(given.get("conversation", {}).get("labels", []))

    async def seen(self, call: Call, needs: HistoryNeeds) -> Seen:
        """The given facts; a meter that applies to the call but is not given counts nothing."""
        applying = _applying(call, needs)
        meters = {meter.name: self._entry(meter, call) for meter in applying}
        return Seen.of(meters, self._failures if needs.failures else [], call.request.conversation_id,
                       self._labels if needs.labels else [])

    def _entry(self, meter: Meter, call: Call) -> dict[str, Any]:
        """A meter's entry from what is given of it: the counts not given are none, and ``reached``, unless given,
        is computed from them as the sidecar computes it."""
        given = self._meters.get(meter.name, {})
        counts = {"count": 0, "sum": 0, "amount": _number(amount_of(meter, call)),
                  "window_seconds": meter.window_seconds, "retry_after_seconds": 0,
                  **{key: value for key, value in given.items() if key != "reached"}}
        if "reached" not in given:
            return shown(meter, counts)
        if not given["reached"] and meter.facts is MeterFacts.REACHED:
            return {"reached": False}
        return {**counts, "reached": given["reached"]}

    async def settle(self, call: Call, needs: HistoryNeeds, seen: Seen, result: ToolResult) -> ToolResult:
        """Nothing is recorded."""
        return result

    def abandon(self, call: Call, seen: Seen) -> None:
        """Nothing was reserved."""

    async def aclose(self) -> None:
        """Nothing runs in the background."""


def _applying(call: Call, needs: HistoryNeeds) -> list[Meter]:
    defn = call.defn
    return [meter for meter in needs.meters if meter.applies(defn.name, defn.side_effect)]


def meter_entry(meter: Meter, counted: MeterCount, amount: float, now: float) -> dict[str, Any]:
    """``input.history.meters[name]`` of a call that adds ``amount``, from what the meter counted before it."""
    # A call counted ahead of this one asked later when it waited less for the meter's lock: never past the window.
    retry = 0 if counted.oldest is None else min(meter.window_seconds,
                                                 max(1, math.ceil(counted.oldest + meter.window_seconds - now)))
    return shown(meter, {"count": counted.count, "sum": _number(counted.total), "amount": _number(amount),
                         "window_seconds": meter.window_seconds, "retry_after_seconds": retry})


def shown(meter: Meter, entry: dict[str, Any]) -> dict[str, Any]:
    """What the input shows of a meter's ``entry`` (its counts): with ``reached`` for a meter with a limit, and only
    ``{"reached": false}`` below the limit of a meter whose ``facts`` are ``reached``."""
    reached = meter.reached(entry["count"], entry["sum"], entry["amount"])
    if reached is None:
        return entry
    if not reached and meter.facts is MeterFacts.REACHED:
        return {"reached": False}
    return {**entry, "reached": reached}


def amount_of(meter: Meter, call: Call) -> float:
    """What ``call`` adds to ``meter``'s sum: the number at its ``sum`` pointer (0 for a negative one), a list's
    length, 0 when absent; a meter without ``sum`` sums nothing. A number over ``MAX_AMOUNT`` refuses the call
    (``INVALID_ARGUMENT``: a sum of such amounts would not stay finite); any other value too (``INTERNAL_ERROR``: the
    policy's meter does not fit the tool; a sum it cannot count is not skipped)."""
    if meter.sum is None:
        return 0.0
    value: Any = call.validated.data
    for token in meter.sum[1:].split("/"):
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isascii() and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            value = None
        if value is None:
            return 0.0
    if isinstance(value, list):
        return float(len(value))
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if value > MAX_AMOUNT:  # so that sums stay finite in every store
            raise CallRefused(ErrorInfo.of(ErrorCode.INVALID_ARGUMENT, f"{meter.sum} is {value:g}, more than the "
                                           f"policy's meter {meter.name!r} can count (at most {MAX_AMOUNT:g})"))
        return max(0.0, float(value))  # a negative amount (a refund) never lowers what a meter counted
    raise CallRefused(ErrorInfo.of(ErrorCode.INTERNAL_ERROR, f"meter {meter.name!r} of the policy sums {meter.sum}, "
                                   f"which must be a number or a list, not {type(value).__name__}"))


def label_entries(rows: Iterable[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """``input.conversation.labels`` from ``(label, tool, time)`` rows, oldest first: each (label, tool) once, at its
    first time."""
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    for label, tool, time in rows:
        entries.setdefault((label, tool), {"label": label, "tool": tool, "time": time})
    return list(entries.values())


def _number(value: float) -> int | float:
    """A whole number as an integer (policies compare it with integers alike on every engine)."""
    return int(value) if value.is_integer() else value
