"""Stage 1, audit: every call's outcome is an audit event; a write's dispatch is one before it runs.

``AuditStage`` is outermost but for the observers (stage 0), so it sees every result, refusals included, and a caller
that went away (``cancelled``). A keyed call that reached its claim is detached from its caller
(``IdempotencyStage``) and records its own outcome with the same ``Auditor``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

from sidecar.canonical import sorted_json
from sidecar.contract import ToolResult
from sidecar.pipeline.call import Arguments, Call
from sidecar.pipeline.chain import Next
from sidecar.state import AuditEvent, Store
from sidecar.tools.masking import Masker

__all__ = ["AuditStage", "Auditor"]

_sorted_text = json.JSONEncoder(sort_keys=True).encode  # as ``json.dumps(..., sort_keys=True)``, made once


class Auditor:
    """Builds a call's audit events (arguments masked) and hands them to the store."""

    def __init__(self, store: Store, masker: Masker) -> None:
        self._store, self._masker = store, masker

    def event(self, call: Call, status: str, error_code: str | None = None) -> AuditEvent:
        """The event of ``call`` at ``status``: who, which tool and version, hashes, decisions and their ids,
        the policy input's parts the other fields lack (for ``toolbooth policy replay``), timing."""
        request = call.request
        arguments = None if call.arguments is None else self._arguments(call.arguments)
        return AuditEvent(
            request_id=call.request_id, time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            principal_id=call.principal.id, tenant=call.principal.tenant,
            tool=request.tool, tool_version=call.tool.version if call.tool else "", input_hash=call.request_hash,
            decisions_json=_sorted_text(call.trail), policy_revision=call.policy_revision,
            idempotency_key=request.idempotency_key, call_id=request.call_id,
            conversation_id=request.conversation_id, status=status, error_code=error_code,
            duration_ms=call.elapsed_ms, arguments_json=arguments,
            decision_ids=_sorted_text(call.decision_ids),
            decision_input=None if call.inputs is None else call.inputs.recorded())

    def _arguments(self, arguments: Arguments) -> str:
        """The recorded arguments: their ``sorted_json``, sensitive values masked (with none, the text the
        policies' input already holds)."""
        if not arguments.sensitive:
            return arguments.call.arguments
        return sorted_json(self._masker.mask(arguments.data, arguments.sensitive))

    def outcome(self, call: Call, result: ToolResult) -> None:
        """Queue the event of ``result`` (written soon, in order), with the code of its primary error (for a
        partial success: of its first failed part)."""
        error = result.error or (result.errors[0] if result.errors else None)
        code = error.code.value if error else None
        self._store.queue_audit(self.event(call, result.status.value, code))

    def cancelled(self, call: Call) -> None:
        """Queue the event of a call whose caller went away before it ended."""
        self._store.queue_audit(self.event(call, "cancelled"))

    async def dispatching(self, call: Call) -> None:
        """Write the event of a write about to run; durable on return (``StoreUnavailableError`` if not)."""
        await self._store.record_audit(self.event(call, "dispatching"))


class AuditStage:
    """Records the outcome of every call that is not detached from its caller."""

    def __init__(self, auditor: Auditor) -> None:
        self._auditor = auditor

    async def run(self, call: Call, next: Next) -> ToolResult:
        try:
            result = await next(call)
        except asyncio.CancelledError:
            if not call.detached:
                self._auditor.cancelled(call)
            raise
        if not call.detached:
            self._auditor.outcome(call, result)
        return result
