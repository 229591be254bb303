"""Stage 0 (an observer), the span of a call: ``execute_tool {tool}``, outermost, so it covers every stage
(OpenTelemetry GenAI semantic conventions for tool execution).

It continues the caller's trace when the transport got one (``Call.trace_headers``, extracted by the
propagators of ``OTEL_PROPAGATORS``, W3C trace context by default), and gives the call its span
(``Call.trace``), so that the stages' own spans (``Call.span``: the store's operations, the handler) and
the one span of its policy decisions (``Call.deciding``, made as the call ends) are its children; a call
the sampler leaves out (``OTEL_TRACES_SAMPLER``, or a caller's unsampled ``traceparent``) makes none of
them, only the SDK's non-recording span, which carries the trace context but records nothing. Its
attributes name the tool, the call and the outcome, never an argument value:

=============================  ===============================================================
``gen_ai.operation.name``      ``execute_tool``
``gen_ai.tool.name``           the tool the request names
``gen_ai.tool.call.id``        the request's ``call_id`` (when it has one)
``gen_ai.tool.type``           ``extension`` (the tool runs in the sidecar, not in the caller)
``toolbooth.request_id``       the call's request id (as in the audit log)
``toolbooth.principal.id``     the caller
``toolbooth.policy.revision``  the policy revision that decided it
``toolbooth.status``           the result's status (``success``, ``denied``, ...)
``error.type``                 the primary error's code, when there is one (the span's status is then ERROR)
=============================  ===============================================================
"""

from __future__ import annotations

from asyncio import CancelledError

from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from sidecar.contract import ToolResult
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.telemetry.spans import CallTrace

__all__ = ["TOOL_TYPE", "TraceStage"]

TOOL_TYPE = "extension"


class TraceStage:
    """Runs each call inside its ``execute_tool`` span."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    async def run(self, call: Call, next: Next) -> ToolResult:
        request = call.request
        parent = propagate.extract(call.trace_headers) if call.trace_headers else None
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": request.tool,
                      "gen_ai.tool.type": TOOL_TYPE, "toolbooth.request_id": call.request_id,
                      "toolbooth.principal.id": call.principal.id, "toolbooth.policy.revision": call.policy_revision}
        if request.call_id:
            attributes["gen_ai.tool.call.id"] = request.call_id
        span = self._tracer.start_span(f"execute_tool {request.tool}", context=parent, kind=SpanKind.INTERNAL,
                                       attributes=attributes, record_exception=False, set_status_on_exception=False)
        if span.is_recording():  # a call the sampler left out makes no spans of its parts
            call.trace = CallTrace(self._tracer, span)
        try:
            result = await next(call)
        except BaseException as exc:  # the caller went away (cancelled), or a bug
            span.set_attributes({"toolbooth.status": "cancelled" if isinstance(exc, CancelledError) else "raised",
                                 "error.type": type(exc).__name__})
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        else:
            error = result.error or (result.errors[0] if result.errors else None)
            if error is None:
                span.set_attribute("toolbooth.status", result.status.value)
            else:
                span.set_attributes({"toolbooth.status": result.status.value, "error.type": error.code.value})
                span.set_status(Status(StatusCode.ERROR, error.code.value))
            return result
        finally:
            if call.trace is not None:
                call.trace.close()
            span.end()
