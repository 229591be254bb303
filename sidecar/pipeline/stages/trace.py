"""The span of a call: ``execute_tool {tool}``, outermost, so it covers every stage (OpenTelemetry GenAI
semantic conventions for tool execution).

It continues the caller's trace when the transport got one (``Call.trace_headers``, extracted by the
propagators of ``OTEL_PROPAGATORS``, W3C trace context by default), and makes the sidecar's tracer the
call's (``Call.tracer``), so that the stages' own spans (``Call.span``: the policy decisions, the store's
operations, the handler) are its children. Its attributes name the tool, the call and the outcome, never an
argument value:

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

from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from sidecar.contract import ToolResult
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next

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
        with self._tracer.start_as_current_span(f"execute_tool {request.tool}", context=parent,
                                                kind=SpanKind.INTERNAL, attributes=attributes) as span:
            call.tracer = self._tracer
            result = await next(call)
            span.set_attribute("toolbooth.status", result.status.value)
            error = result.error or (result.errors[0] if result.errors else None)
            if error is not None:
                span.set_attribute("error.type", error.code.value)
                span.set_status(Status(StatusCode.ERROR, error.code.value))
            return result
