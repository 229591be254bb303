"""``CallTrace``: the span of one call and the spans of its parts, made as cheaply as the SDK allows.

None of them is made the current span (no context attached or detached per span): each part's span is
started with the call's span as its explicit parent, and the log lines of a call read the trace id from the
call itself (``sidecar.telemetry.call_log``). Exceptions are not recorded as span events (their messages
could carry argument values); an exception that ends a part sets its status to ERROR with the exception's
type name.

The policy decisions of a call share one span, ``policy`` (``CallTrace.deciding``): each decision only
notes its outcome, and the span is made once, when the call's span ends (``CallTrace.close``), from the
first decision's start to the last one's end, all its attributes given at creation. A span per decision
would cost the SDK's ~50 µs of CPU (and as much again to export) three times per call, more than the
decisions themselves, which the decision cache answers in microseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import time_ns
from types import TracebackType

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

__all__ = ["POLICY_SPAN", "CallTrace", "DecisionOutcome", "PartSpan"]

POLICY_SPAN = "policy"


class CallTrace:
    """The span of a call (``span``), the parent of its parts' spans (``part``) and the notes of its policy
    decisions (``deciding``), made into one span by ``close``."""

    __slots__ = ("_decided", "_parent", "_tracer", "span")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self._tracer, self.span = tracer, span
        self._parent = trace.set_span_in_context(span)
        self._decided: _Decisions | None = None

    def part(self, name: str) -> PartSpan:
        """A span named ``name`` for one part of the call, started when its block is entered."""
        return PartSpan(self._tracer, name, self._parent)

    @contextmanager
    def deciding(self, stage: str) -> Iterator[DecisionOutcome]:
        """Note the decision of ``stage`` made while the block runs, its outcome set on what it yields; an
        exception leaving the block marks the ``policy`` span as failed with the exception's type name."""
        decided = self._decided
        if decided is None:
            decided = self._decided = _Decisions(time_ns())
        decided.stages.append(stage)
        try:
            yield DecisionOutcome(stage, decided.attributes)
        except BaseException as exc:
            decided.error = decided.error or type(exc).__name__  # the first one: later ones may follow from it
            raise
        finally:
            decided.end = time_ns()

    def close(self) -> None:
        """Make the ``policy`` span of the decisions noted (none if there were none); the call's own span is
        its owner's to end."""
        decided, self._decided = self._decided, None
        if decided is None:
            return
        attributes = decided.attributes
        attributes["toolbooth.policy.stages"] = tuple(decided.stages)
        if decided.error is not None:
            attributes.setdefault("error.type", decided.error)
        error = attributes.get("error.type")
        span = self._tracer.start_span(POLICY_SPAN, context=self._parent, attributes=attributes,
                                       start_time=decided.start, record_exception=False,
                                       set_status_on_exception=False)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end(end_time=decided.end)


class DecisionOutcome:
    """What one policy decision of a traced call says: attributes ``toolbooth.policy.{stage}.{name}`` of the
    call's ``policy`` span."""

    __slots__ = ("_attributes", "_prefix")

    def __init__(self, stage: str, attributes: dict[str, AttributeValue]) -> None:
        self._prefix, self._attributes = f"toolbooth.policy.{stage}.", attributes

    def set(self, name: str, value: AttributeValue) -> None:
        """The decision's ``name`` (``allow``, ``required``) is ``value``."""
        self._attributes[self._prefix + name] = value

    def failed(self, error_type: str) -> None:
        """The engine could not decide: ``toolbooth.policy.{stage}.error`` and the span's ``error.type``."""
        self._attributes[self._prefix + "error"] = error_type
        self._attributes.setdefault("error.type", error_type)


class _Decisions:
    """The decisions noted so far: when the first started and the last ended, their outcomes, the first
    exception's type."""

    __slots__ = ("attributes", "end", "error", "stages", "start")

    def __init__(self, start: int) -> None:
        self.start = self.end = start
        self.stages: list[str] = []
        self.attributes: dict[str, AttributeValue] = {}
        self.error: str | None = None


class PartSpan:
    """A context manager: a child span of the call while the block runs."""

    __slots__ = ("_name", "_parent", "_span", "_tracer")

    def __init__(self, tracer: Tracer, name: str, parent: Context) -> None:
        self._tracer, self._name, self._parent = tracer, name, parent

    def __enter__(self) -> Span:
        self._span = self._tracer.start_span(self._name, context=self._parent, record_exception=False,
                                             set_status_on_exception=False)
        return self._span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None:
            self._span.set_status(Status(StatusCode.ERROR, kind.__name__))
        self._span.end()
