"""Reading audit events back: OPA decision-log entries (``sidecar.pipeline.decision_log``) and the calls replay
takes from them (``sidecar.pipeline.replay``). Events a real sidecar writes are checked in
``tests/integration/test_policy_replay.py``; here the edges."""

from __future__ import annotations

import json
from dataclasses import replace

from sidecar.pipeline.decision_log import decision_entries
from sidecar.pipeline.replay import Recorded, Skip
from sidecar.state import AuditEvent, AuditRecord

PRINCIPAL = {"id": "dev-1", "tenant": "acme", "roles": ["developer"], "permissions": []}
TOOL = {"name": "echo", "version": "1.0.0", "side_effect": "none", "permissions": [], "plugin": "tests"}


def record(trail: dict[str, object], ids: dict[str, str] | None, *, arguments: str | None = None) -> AuditRecord:
    return AuditRecord(7, AuditEvent(
        request_id="r-1", time="2026-12-01T10:00:00.000+00:00", principal_id="dev-1", tenant="acme", tool="echo",
        tool_version="1.0.0", input_hash="sha256:0", decisions_json=json.dumps(trail), policy_revision="sha256:rev",
        idempotency_key=None, call_id=None, conversation_id="conv-1", status="error", error_code="SERVICE_UNAVAILABLE",
        duration_ms=1, arguments_json=arguments, decision_ids=None if ids is None else json.dumps(ids),
        decision_input=json.dumps({"principal": PRINCIPAL, "tool": TOOL, "time": "2026-12-01T10:00:00Z"})),
        None, None)


def test_a_failed_decision_is_an_entry_with_an_error_and_no_result() -> None:
    trail = {"availability": {"allow": True}, "authz": {"error": "OPA did not answer"}}
    ids = {"availability": "id-a", "authz": "id-b"}
    availability, authz = decision_entries(record(trail, ids, arguments='{"text": "hmac-sha256:00"}'))
    assert availability["result"] == {"allow": True} and "call" not in availability["input"]
    assert availability["input"]["context"] == {"stage": "availability", "time": "2026-12-01T10:00:00Z",
                                                "conversation_id": "conv-1"}
    assert authz["error"] == {"code": "evaluation_error", "message": "OPA did not answer"} and "result" not in authz
    assert authz["decision_id"] == "id-b" and authz["req_id"] == 7
    assert authz["input"]["call"] == {"arguments": {"text": "hmac-sha256:00"}, "conversation_id": "conv-1",
                                      "idempotency_key": None}


def test_a_deny_shows_its_flag_and_events_before_the_decision_log_have_no_entries() -> None:
    [denied] = decision_entries(record({"availability": {"reason": "hidden"}}, {"availability": "id-a"}))
    assert denied["result"] == {"allow": False, "reason": "hidden"}
    assert list(decision_entries(record({"availability": {"allow": True}}, None))) == []


def test_replay_skips_events_without_decisions_and_says_why() -> None:
    assert Recorded.of(record({}, None)) is Skip.BEFORE_DECISION_LOG
    refused = record({}, {})
    refused = AuditRecord(refused.id, replace(refused.event, decision_input=None), None, None)
    assert Recorded.of(refused) is Skip.NO_DECISION
    cancelled = record({"availability": {"allow": True}}, {"availability": "id-a"},  # cancelled during authz
                       arguments='{"text": "x"}')
    assert Recorded.of(cancelled) is Skip.INCOMPLETE
