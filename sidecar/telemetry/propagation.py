"""The trace context a caller sends (W3C ``traceparent``, ``tracestate``, and whatever else ``OTEL_PROPAGATORS``
asks for): picked from the transport's headers at its edge, handed to the pipeline, which carries it on the
``Call`` (``Call.trace_headers``) for the trace stage to continue.

A transport picks the headers (``trace_headers``) and runs the call ``continuing`` them; ``Pipeline`` reads
``incoming()`` when it makes each ``Call``. Only the propagators' own header names are kept, so nothing
else of the caller's metadata reaches a span.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from contextvars import ContextVar, Token

from opentelemetry import propagate
from opentelemetry.propagators.textmap import TextMapPropagator

__all__ = ["continuing", "incoming", "trace_headers"]

_incoming: ContextVar[Mapping[str, str] | None] = ContextVar("toolbooth_trace_headers", default=None)


def trace_headers(pairs: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The propagators' headers among ``pairs`` (gRPC metadata, HTTP headers), names lower case."""
    fields = _fields(propagate.get_global_textmap())
    picked: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        if key in fields and isinstance(value, str):
            picked[key] = value
    return picked


@functools.lru_cache(maxsize=4)
def _fields(propagator: TextMapPropagator) -> frozenset[str]:
    """The header names ``propagator`` reads, once per propagator (its ``fields`` builds new sets on every read)."""
    return frozenset(propagator.fields)


class continuing:
    """Calls made inside continue the trace of ``headers`` (nothing to continue when empty). A class, not a
    generator: it runs around every RPC when the sidecar traces."""

    __slots__ = ("_headers", "_token")

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers: Mapping[str, str] = headers
        self._token: Token[Mapping[str, str] | None] | None = None

    def __enter__(self) -> None:
        if self._headers:
            self._token = _incoming.set(self._headers)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _incoming.reset(self._token)


def incoming() -> Mapping[str, str] | None:
    """The trace headers of the transport's request being served, if it sent any."""
    return _incoming.get()
