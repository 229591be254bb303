"""The audit log as OPA decision logs (``toolbooth audit export --format opa``).

Each decision of an audited call becomes one entry in the shape OPA's decision-log plugin sends, so the
pipelines that ingest OPA's logs ingest these: ``decision_id`` (the UUID the call's audit event names it
by), ``path`` (the rule, as OPA names it: ``toolbooth/authz/decision``), ``input`` (the policy input
as the decision got it, rebuilt from the event: sensitive values stay masked), ``result`` (the decision
document) or ``error``, ``timestamp`` (the decision's ``input.context.time``), ``bundles`` (the policy
revision, under the bundle name ``toolbooth``), ``labels`` (``app``, ``version``) and ``req_id`` (the
audit event's id, shared by the decisions of one call). Events from before the decision log, or of calls
refused before any decision, have no entries; a write audited as ``dispatching`` and again with its outcome
made its decisions once, and ``decision_log`` exports them once (with the first event).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any

from sidecar import __version__
from sidecar.contract import CallRequest
from sidecar.pipeline.dry_run import Step
from sidecar.pipeline.history import members_read, recorded
from sidecar.policy import CALL_STAGES, RULES, Stage
from sidecar.policy.input import CallInput, InputParts
from sidecar.state import AuditRecord

__all__ = ["BUNDLE_NAME", "LABELS", "decision_entries", "decision_log"]

BUNDLE_NAME = "toolbooth"
LABELS = {"app": "toolbooth", "version": __version__}


async def decision_log(records: AsyncIterable[AuditRecord]) -> AsyncIterator[dict[str, Any]]:
    """The entries of every decision of ``records`` (oldest first), each decision once."""
    dispatched: set[str] = set()  # writes whose ``dispatching`` event was exported: their outcome repeats it
    async for record in records:
        request_id = record.event.request_id
        if request_id in dispatched:
            dispatched.discard(request_id)
            continue
        if record.event.status == "dispatching":
            dispatched.add(request_id)
        for entry in decision_entries(record):
            yield entry


def decision_entries(record: AuditRecord) -> Iterator[dict[str, Any]]:
    """The OPA decision-log entries of ``record``'s decisions, in the order they were made."""
    event = record.event
    if event.decision_ids is None or event.decision_input is None:
        return
    ids: dict[str, str] = json.loads(event.decision_ids)
    trail: dict[str, Any] = json.loads(event.decisions_json)
    parts = InputParts.from_recorded(event.decision_input, event.conversation_id)
    call = None if event.arguments_json is None else CallInput.of(json.loads(event.arguments_json), CallRequest(
        tool=event.tool, idempotency_key=event.idempotency_key, conversation_id=event.conversation_id))
    history = recorded(trail)
    for stage in CALL_STAGES:
        if stage.value not in ids or stage.value not in trail:
            continue
        before = stage is Stage.AVAILABILITY
        document = trail[stage.value]
        entry: dict[str, Any] = {
            "decision_id": ids[stage.value],
            "path": RULES[stage].removeprefix("data.").replace(".", "/"),
            "input": parts.build(stage, None if before else call, None if before or history is None
                                 else history.json_of(members_read(trail, stage))).document(),
            "timestamp": parts.time,
            "bundles": {BUNDLE_NAME: {"revision": event.policy_revision}},
            "labels": LABELS,
            "req_id": record.id,
        }
        if "error" in document:
            entry["error"] = {"code": "evaluation_error", "message": document["error"]}
        else:
            entry["result"] = Step(stage.value, decision=document).document()
        yield entry
