package toolbooth.approval_test

import rego.v1

import data.toolbooth.approval

call_of(tool, side_effect) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": ["developer"], "permissions": []},
	"tool": {"name": tool, "version": "1.0.0", "side_effect": side_effect, "permissions": []},
	"call": {"arguments": {}, "conversation_id": "c1", "idempotency_key": "k"},
	"context": {"stage": "approval", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
}

test_read_only_tool_needs_no_approval if {
	d := approval.decision with input as call_of("calculate", "none") with data.toolbooth.approval.tools as []
	not d.required
}

test_reversible_tool_needs_no_approval if {
	not approval.decision.required with input as call_of("create_ticket", "external_reversible")
		with data.toolbooth.approval.tools as []
}

test_irreversible_tool_needs_approval if {
	d := approval.decision with input as call_of("send_email", "external_irreversible")
		with data.toolbooth.approval.tools as []
	d.required
	d.reason == "the tool's effects are external and irreversible"
}

test_listed_tool_needs_approval if {
	d := approval.decision with input as call_of("calculate", "none")
		with data.toolbooth.approval.tools as ["calculate"]
	d.required
	d.reason == "approval is configured for this tool"
}

test_both_reasons_are_given if {
	d := approval.decision with input as call_of("send_email", "external_irreversible")
		with data.toolbooth.approval.tools as ["send_email"]
	d.reason == "approval is configured for this tool; the tool's effects are external and irreversible"
}

test_missing_approval_list_needs_no_approval if {
	not approval.decision.required with input as call_of("calculate", "none")
		with data.toolbooth.approval as {}
}
