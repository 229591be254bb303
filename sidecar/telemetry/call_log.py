"""The call a log line is written during: set for the time it runs through the chain (``in_call``), read only
when a line is actually written (``call_fields``), so a call costs one context variable, not a line's fields.

Each JSON line written during a call carries ``request_id``, ``tool``, ``principal`` (the caller's id) and,
when the sidecar traces, the ``trace_id`` and ``span_id`` of the call's span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

if TYPE_CHECKING:
    from sidecar.pipeline.call import Call

__all__ = ["call_fields", "in_call"]

_call: ContextVar[Call | None] = ContextVar("toolbooth_log_call", default=None)


@contextlib.contextmanager
def in_call(call: Call) -> Iterator[None]:
    """Lines written inside carry ``call``'s fields."""
    token = _call.set(call)
    try:
        yield
    finally:
        _call.reset(token)


def call_fields(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the fields of the call being served, and of its span, added to ``event``."""
    call = _call.get()
    if call is None:
        return event
    event.setdefault("request_id", call.request_id)
    event.setdefault("tool", call.request.tool)
    event.setdefault("principal", call.principal.id)
    if call.trace is not None:
        span = call.trace.span.get_span_context()
        event.setdefault("trace_id", trace.format_trace_id(span.trace_id))
        event.setdefault("span_id", trace.format_span_id(span.span_id))
    return event
