"""The trace context a caller sends (W3C ``traceparent``, ``tracestate``, and whatever else ``OTEL_PROPAGATORS``
asks for): picked from the transport's headers at its edge, handed to the pipeline, which carries it on the
``Call`` (``Call.trace_headers``) for the trace stage to continue.

A transport picks the headers (``trace_headers``) and runs the call ``continuing`` them; ``Pipeline`` reads
``incoming()`` when it makes each ``Call``. Only the propagators' own header names are kept, so nothing
else of the caller's metadata reaches a span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar

from opentelemetry import propagate

__all__ = ["continuing", "incoming", "trace_headers"]

_incoming: ContextVar[Mapping[str, str] | None] = ContextVar("toolbooth_trace_headers", default=None)


def trace_headers(pairs: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The propagators' headers among ``pairs`` (gRPC metadata, HTTP headers), names lower case."""
    fields = propagate.get_global_textmap().fields
    picked: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        if key in fields and isinstance(value, str):
            picked[key] = value
    return picked


@contextlib.contextmanager
def continuing(headers: Mapping[str, str]) -> Iterator[None]:
    """Calls made inside continue the trace of ``headers`` (nothing to continue when empty)."""
    if not headers:
        yield
        return
    token = _incoming.set(headers)
    try:
        yield
    finally:
        _incoming.reset(token)


def incoming() -> Mapping[str, str] | None:
    """The trace headers of the transport's request being served, if it sent any."""
    return _incoming.get()
