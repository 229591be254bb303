"""``CallTrace``: the span of one call and the spans of its parts, made as cheaply as the SDK allows.

None of them is made the current span (no context attached or detached per span): each part's span is
started with the call's span as its explicit parent, and the log lines of a call read the trace id from the
call itself (``sidecar.telemetry.call_log``). Exceptions are not recorded as span events (their messages
could carry argument values); an exception that ends a part sets its status to ERROR with the exception's
type name.
"""

from __future__ import annotations

from types import TracebackType

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

__all__ = ["CallTrace", "PartSpan"]


class CallTrace:
    """The span of a call (``span``) and the parent of its parts' spans (``part``)."""

    __slots__ = ("_parent", "_tracer", "span")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self._tracer, self.span = tracer, span
        self._parent = trace.set_span_in_context(span)

    def part(self, name: str) -> PartSpan:
        """A span named ``name`` for one part of the call, started when its block is entered."""
        return PartSpan(self._tracer, name, self._parent)


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
