"""The trace context a transport hands the pipeline (``sidecar.telemetry.propagation``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sidecar.telemetry.propagation import continuing, incoming, trace_headers

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
METADATA = (("User-Agent", "grpc-python"), ("TraceParent", TRACEPARENT), ("baggage", "k=v"),
            ("tracestate", b"binary values are not trace context"), ("authorization", "Bearer secret"))


@pytest.fixture
def propagators() -> Iterator[None]:
    saved = propagate.get_global_textmap()
    yield
    propagate.set_global_textmap(saved)


def test_only_the_propagators_headers_are_picked_names_lower_case() -> None:
    assert trace_headers(METADATA) == {"traceparent": TRACEPARENT, "baggage": "k=v"}


def test_the_headers_follow_the_propagators_in_use(propagators: None) -> None:
    propagate.set_global_textmap(CompositePropagator([W3CBaggagePropagator()]))
    assert trace_headers(METADATA) == {"baggage": "k=v"}
    propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator()]))
    assert trace_headers(METADATA) == {"traceparent": TRACEPARENT}


def test_calls_continue_the_headers_only_inside() -> None:
    headers = {"traceparent": TRACEPARENT}
    assert incoming() is None
    with continuing(headers):
        assert incoming() == headers
        with continuing({}):  # nothing to continue: the outer trace stays
            assert incoming() == headers
    assert incoming() is None


def test_the_headers_are_let_go_when_the_call_raises() -> None:
    with pytest.raises(RuntimeError), continuing({"traceparent": TRACEPARENT}):
        raise RuntimeError("the call failed")
    assert incoming() is None
