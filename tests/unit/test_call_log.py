"""The log context of a call: what a line written during it carries, and what a copied context keeps."""

from __future__ import annotations

import contextvars
import gc
import weakref

from sidecar.contract import CallRequest, Principal
from sidecar.pipeline.call import Call
from sidecar.telemetry.call_log import call_fields, in_call


def _call() -> Call:
    return Call(principal=Principal(id="alice"), request=CallRequest(tool="echo"), policy_revision="r1")


def test_lines_written_during_a_call_carry_its_fields_and_others_do_not() -> None:
    call = _call()
    with in_call(call.request_id, call.request.tool, call.principal.id, None):
        inside = call_fields(None, "info", {})
    assert inside == {"request_id": call.request_id, "tool": "echo", "principal": "alice"}
    assert call_fields(None, "info", {}) == {}


def test_a_context_copied_during_a_call_keeps_its_fields_but_not_the_call() -> None:
    """Timers and callbacks scheduled during a call copy its context, and may outlive it: they must not keep
    the call's objects alive for the garbage collector to walk."""
    call = _call()
    with in_call(call.request_id, call.request.tool, call.principal.id, None):
        copied = contextvars.copy_context()
    request_id, alive = call.request_id, weakref.ref(call.request)
    del call
    gc.collect()
    assert alive() is None
    assert copied.run(call_fields, None, "info", {})["request_id"] == request_id
