"""What of a call's history a policy set reads: the meters its data declares, and whether it reads labels or failures.

A policy set declares its meters in ``data.toolbooth.history.meters`` (``docs/policies.md``), one object each::

    "writes_per_principal": {"by": ["principal"], "window_seconds": 60,
                             "side_effects": ["internal_reversible", "external_reversible"], "limit": 30}

``by`` (any of ``principal``, ``tenant``, ``tool``, ``conversation``, at least one) says whose calls a meter counts
together, ``window_seconds`` how far back; ``tools`` and ``side_effects`` (optional) which calls it counts; ``sum``
(optional, a JSON pointer into the arguments) what each call adds to its sum (a number, or a list's length). Other
keys are the policies' own, but ``limit``, which they compare counts and sums with, must be a number of 0 or more (a
string there would switch a limit off), and ``facts`` says what a call's input shows of a meter with a limit:
``counts`` (the default: its count, sum and wait, and whether the call ``reached`` the limit) or ``reached`` (only
``{"reached": false}`` below the limit, the counts from the limit on: an input that stays the same from one call to
the next, so the decisions that read the meter stay in the decision cache). The sidecar computes only what the set
reads (``HistoryNeeds``): the meters it declares, and the conversation's labels or the call's failures only where its
modules or data mention ``labels`` or ``failures``, as the decision cache learns whether ``idempotency_key`` is read.
A set that reads none of it (``NO_HISTORY``) pays nothing. A meter may not look back further than the store keeps the
history (``check_meter_windows``, run where a set loads: ``sidecar.policy.factory``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.contract import SideEffect
from sidecar.errors import MalformedDecisionError, PolicyLoadError
from sidecar.policy.decision import Stage
from sidecar.policy.reads import ALL_MEMBERS

__all__ = ["HISTORY_RULE", "MAX_WINDOW_SECONDS", "NO_HISTORY", "RETENTION_KEY", "HistoryNeeds", "Meter", "MeterFacts",
           "MeterKey", "check_meter_windows", "parse_history_needs", "window_problem"]

HISTORY_RULE = "data.toolbooth.history"
MAX_WINDOW_SECONDS = 366 * 24 * 3600
LABELS, FAILURES = "labels", "failures"  # the words whose mention makes the sidecar compute them
RETENTION_KEY = "store.history_retention_hours"  # how long the store keeps the history a meter counts


class MeterKey(StrEnum):
    """What a meter counts a call under (``by``)."""

    PRINCIPAL = "principal"
    TENANT = "tenant"
    TOOL = "tool"
    CONVERSATION = "conversation"


class MeterFacts(StrEnum):
    """What a call's input shows of a meter with a limit (``facts``)."""

    COUNTS = "counts"  # always its counts
    REACHED = "reached"  # its counts only once this call would pass the limit


@dataclass(frozen=True, slots=True)
class Meter:
    """One declared meter (``data.toolbooth.history.meters[name]``), checked."""

    name: str
    by: tuple[MeterKey, ...]
    window_seconds: int
    tools: frozenset[str] | None = None
    side_effects: frozenset[SideEffect] | None = None
    sum: str | None = None  # a JSON pointer into the arguments
    limit: float | None = None
    facts: MeterFacts = MeterFacts.COUNTS

    def applies(self, tool: str, side_effect: SideEffect) -> bool:
        """Whether a call of ``tool`` counts on this meter."""
        return ((self.tools is None or tool in self.tools)
                and (self.side_effects is None or side_effect in self.side_effects))

    def reached(self, count: float, total: float, amount: float) -> bool | None:
        """Whether a call adding ``amount`` to ``count`` calls summing ``total`` would pass the limit (for a meter
        that sums: ``total + amount > limit``; else ``count >= limit``); ``None`` without a limit."""
        if self.limit is None:
            return None
        return total + amount > self.limit if self.sum is not None else count >= self.limit


@dataclass(frozen=True, slots=True)
class HistoryNeeds:
    """What of a call's history one policy set reads."""

    meters: tuple[Meter, ...] = ()
    labels: bool = False
    failures: bool = False
    reads: tuple[tuple[Stage, frozenset[str]], ...] | None = None  # per decision (``decision_reads``); None: all

    def members(self, stage: Stage) -> frozenset[str]:
        """The members of the call's history (``history``, ``conversation``) ``stage``'s decision gets."""
        if self.reads is not None:
            for decided, members in self.reads:
                if decided is stage:
                    return members
        return ALL_MEMBERS

    @property
    def any(self) -> bool:
        """Whether the set reads any history at all."""
        return bool(self.meters) or self.labels or self.failures

    @property
    def conversation(self) -> bool:
        """Whether the conversation's events (labels, failures) are read."""
        return self.labels or self.failures


NO_HISTORY = HistoryNeeds()


def parse_history_needs(value: Any, mentions: Callable[[str], bool],
                        reads: Mapping[Stage, frozenset[str]] | None = None) -> HistoryNeeds:
    """The needs of a set whose ``data.toolbooth.history`` is ``value`` (``None``: undefined), whose modules or data
    mention a word when ``mentions`` says so, and whose decisions read what ``reads`` says (``decision_reads``;
    ``None``: not known, each reads all); a malformed declaration raises ``MalformedDecisionError``."""
    if value is not None and not isinstance(value, dict):
        raise MalformedDecisionError(f"{HISTORY_RULE} must be an object, got {_shown(value)}")
    meters = (value or {}).get("meters")
    if meters is not None and not isinstance(meters, dict):
        raise MalformedDecisionError(f"{HISTORY_RULE}.meters must be an object of meters by name, got {_shown(meters)}")
    declared = tuple(_meter(name, spec) for name, spec in sorted((meters or {}).items()))
    return HistoryNeeds(declared, mentions(LABELS), mentions(FAILURES),
                        None if reads is None else tuple(sorted(reads.items())))


def check_meter_windows(needs: HistoryNeeds, retention_seconds: float) -> None:
    """``PolicyLoadError`` naming the first meter of ``needs`` that looks back further than the call history is kept
    (``retention_seconds``): its count would miss the calls already deleted."""
    for meter in needs.meters:
        if (problem := window_problem(meter, retention_seconds)) is not None:
            raise PolicyLoadError(problem)


def window_problem(meter: Meter, retention_seconds: float) -> str | None:
    """What is wrong with ``meter`` when it looks back further than the call history is kept, else ``None``."""
    if meter.window_seconds <= retention_seconds:
        return None
    return (f"meter {meter.name!r} of the policy looks back {meter.window_seconds} s, longer than the call history "
            f"is kept ({retention_seconds:.15g} s: {RETENTION_KEY}); shorten its window_seconds or raise "
            f"{RETENTION_KEY}")


def _meter(name: str, spec: Any) -> Meter:
    where = f"{HISTORY_RULE}.meters.{name}"
    if not isinstance(spec, Mapping):
        raise MalformedDecisionError(f"{where} must be an object, got {_shown(spec)}")
    by = spec.get("by")
    keys = [key.value for key in MeterKey]
    if not isinstance(by, list) or not by or not all(isinstance(key, str) and key in keys for key in by) \
            or len(set(by)) != len(by):
        raise MalformedDecisionError(f"{where}.by must list one or more of {', '.join(keys)}, each once, "
                                     f"got {_shown(by)}")
    window = spec.get("window_seconds")
    if not isinstance(window, int) or isinstance(window, bool) or not 0 < window <= MAX_WINDOW_SECONDS:
        raise MalformedDecisionError(f"{where}.window_seconds must be a whole number of seconds, "
                                     f"1-{MAX_WINDOW_SECONDS}, got {_shown(window)}")
    limit = spec.get("limit")
    if limit is not None and (not isinstance(limit, int | float) or isinstance(limit, bool) or limit < 0):
        raise MalformedDecisionError(f"{where}.limit, which the policies compare counts and sums with, must be a "
                                     f"number of 0 or more, got {_shown(limit)}")
    facts = spec.get("facts", MeterFacts.COUNTS.value)
    if facts not in [value.value for value in MeterFacts]:
        raise MalformedDecisionError(f"{where}.facts must be one of {', '.join(value.value for value in MeterFacts)}, "
                                     f"got {_shown(facts)}")
    if facts == MeterFacts.REACHED and limit is None:
        raise MalformedDecisionError(f"{where}.facts is \"reached\", which needs a limit: the meter has none")
    return Meter(name, tuple(MeterKey(key) for key in by), window, _names(where, spec, "tools"),
                 _side_effects(where, spec), _pointer(where, spec), None if limit is None else float(limit),
                 MeterFacts(facts))


def _names(where: str, spec: Mapping[str, Any], key: str) -> frozenset[str] | None:
    names = spec.get(key)
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) and name for name in names):
        raise MalformedDecisionError(f"{where}.{key} must be a list of names, got {_shown(names)}")
    return frozenset(names)


def _side_effects(where: str, spec: Mapping[str, Any]) -> frozenset[SideEffect] | None:
    names = _names(where, spec, "side_effects")
    if names is None:
        return None
    known = {effect.value for effect in SideEffect}
    if unknown := sorted(names - known):
        raise MalformedDecisionError(f"{where}.side_effects: unknown side effect(s) {', '.join(unknown)}; "
                                     f"known: {', '.join(sorted(known))}")
    return frozenset(SideEffect(name) for name in names)


def _pointer(where: str, spec: Mapping[str, Any]) -> str | None:
    pointer = spec.get("sum")
    if pointer is not None and (not isinstance(pointer, str) or not pointer.startswith("/")):
        raise MalformedDecisionError(f"{where}.sum must be a JSON pointer into the arguments (\"/amount\"), "
                                     f"got {_shown(pointer)}")
    return pointer


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
