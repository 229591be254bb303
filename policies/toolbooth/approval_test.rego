package toolbooth.approval_test

import rego.v1

import data.toolbooth.approval

call_with(tool, side_effect, arguments) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": ["developer"], "permissions": []},
	"tool": {"name": tool, "version": "1.0.0", "side_effect": side_effect, "permissions": []},
	"call": {"arguments": arguments, "conversation_id": "c1", "idempotency_key": "k"},
	"context": {"stage": "approval", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
}

call_of(tool, side_effect) := call_with(tool, side_effect, {})

mail := {"send_email": ["bcc", "attachments"]}

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

test_empty_approval_data_needs_no_approval if {
	d := approval.decision with input as call_with("send_email", "none", {"bcc": "b@x"})
		with data.toolbooth.approval.tools as []
		with data.toolbooth.approval.sensitive_arguments as {}
	d == {"required": false, "reason": "no approval needed"}
}

test_not_required_decision_is_exactly_that if {
	d := approval.decision with input as call_of("calculate", "none")
	d == {"required": false, "reason": "no approval needed"}
}

test_required_decision_names_approvers_and_preview_lifetime if {
	d := approval.decision with input as call_of("send_email", "external_irreversible")
		with data.toolbooth.approval.approver_roles as ["security"]
		with data.toolbooth.approval.preview_ttl_seconds as 60
	d == {
		"required": true,
		"reason": "the tool's effects are external and irreversible",
		"approver_roles": ["security"],
		"preview_ttl_seconds": 60,
	}
}

test_default_data_approvers_and_preview_lifetime if {
	d := approval.decision with input as call_of("send_email", "external_irreversible")
	d.approver_roles == ["approver"]
	d.preview_ttl_seconds == 900
}

test_sensitive_argument_with_a_value_needs_approval if {
	d := approval.decision with input as call_with("send_email", "external_reversible", {"to": "a@x", "bcc": ["b@x"]})
		with data.toolbooth.approval.sensitive_arguments as mail
	d.required
	d.reason == `approval is configured for argument "bcc"`
}

test_every_sensitive_argument_is_named if {
	call := call_with("send_email", "external_reversible", {"bcc": "b@x", "attachments": ["f"]})
	d := approval.decision with input as call with data.toolbooth.approval.sensitive_arguments as mail
	d.reason == `approval is configured for argument "attachments"; approval is configured for argument "bcc"`
}

test_sensitive_argument_without_a_value_needs_no_approval if {
	every value in [null, "", [], {}] {
		not approval.decision.required with input as call_with("send_email", "external_reversible", {"bcc": value})
			with data.toolbooth.approval.sensitive_arguments as mail
	}
	not approval.decision.required with input as call_with("send_email", "external_reversible", {"to": "a@x"})
		with data.toolbooth.approval.sensitive_arguments as mail
}

test_sensitive_arguments_apply_to_their_tool_only if {
	not approval.decision.required with input as call_with("create_ticket", "external_reversible", {"bcc": "x"})
		with data.toolbooth.approval.sensitive_arguments as mail
}

test_default_data_marks_bcc_of_send_email_sensitive if {
	d := approval.decision with input as call_with("send_email", "external_reversible", {"bcc": ["b@x"]})
	d.reason == `approval is configured for argument "bcc"`
}

approver_input(id, tenant, roles) := {
	"principal": {"id": id, "tenant": tenant, "roles": roles, "permissions": []},
	"preview": {
		"preview_id": "p1", "tool": "send_email", "tool_version": "1.0.0", "reason": "r",
		"requested_by": {"id": "u1", "tenant": "t1"}, "approver_roles": ["approver", "security"],
	},
	"context": {"stage": "approver", "time": "2026-11-30T15:00:00Z"},
}

test_holder_of_an_approver_role_may_approve if {
	approval.approver.allow with input as approver_input("boss", "t1", ["developer", "security"])
}

test_approver_without_the_role_may_not if {
	d := approval.approver with input as approver_input("boss", "t1", ["developer"])
	d == {"allow": false, "reason": "approving this call needs one of its approver roles"}
}

test_nobody_approves_their_own_call if {
	d := approval.approver with input as approver_input("u1", "t1", ["approver"])
	d == {"allow": false, "reason": "nobody may approve their own call"}
}

test_approver_of_another_tenant_may_not if {
	d := approval.approver with input as approver_input("boss", "t2", ["approver"])
	d == {"allow": false, "reason": "the call belongs to another tenant"}
}

test_same_id_in_another_tenant_is_another_principal_but_another_tenant if {
	not approval.approver.allow with input as approver_input("u1", "t2", ["approver"])
}

test_create_task_needs_approval_by_default if {
	d := approval.decision with input as call_of("create_task", "internal_reversible")
	d.required
	d.reason == "approval is configured for this tool"
}

# --- the conversation's labels --------------------------------------------------------------------

restricted_document := {"label": "restricted", "tool": "read_document", "time": "2026-12-06T10:00:00Z"}

untrusted_page := {"label": "untrusted", "tool": "fetch_page", "time": "2026-12-06T10:01:00Z"}

carrying(call, labels) := object.union(call, {"conversation": {"id": "c1", "labels": labels}})

labelled(tool, side_effect, labels) := carrying(call_of(tool, side_effect), labels)

test_an_untrusted_conversation_needs_approval_for_a_write if {
	d := approval.decision with input as labelled("create_ticket", "external_reversible", [untrusted_page])
		with data.toolbooth.approval.labels as ["untrusted"]
	d == {
		"required": true,
		"reason": `the conversation carries "untrusted" (from fetch_page); conversation labels: untrusted (fetch_page)`,
		"approver_roles": ["approver"],
		"preview_ttl_seconds": 900,
	}
}

test_an_untrusted_conversation_needs_no_approval_for_a_read if {
	d := approval.decision with input as labelled("search_documents", "none", [untrusted_page, restricted_document])
		with data.toolbooth.approval.labels as ["untrusted"]
	d == {"required": false, "reason": "no approval needed"}
}

test_each_tool_that_brought_a_listed_label_is_a_reason if {
	d := approval.decision with input as labelled("write_file", "internal_reversible", [
		untrusted_page,
		{"label": "untrusted", "tool": "search_web", "time": "2026-12-06T10:02:00Z"},
		restricted_document,
	])
		with data.toolbooth.approval.labels as ["untrusted"]
	d.reason == concat("; ", [
		`the conversation carries "untrusted" (from fetch_page)`,
		`the conversation carries "untrusted" (from search_web)`,
		"conversation labels: restricted (read_document), untrusted (fetch_page), untrusted (search_web)",
	])
}

test_an_unlisted_label_needs_no_approval if {
	d := approval.decision with input as labelled("create_ticket", "external_reversible", [restricted_document])
		with data.toolbooth.approval.labels as ["untrusted"]
	d == {"required": false, "reason": "no approval needed"}
	not approval.decision.required with input as labelled("create_ticket", "external_reversible", [untrusted_page])
		with data.toolbooth.approval.labels as []
}

test_a_required_reason_ends_with_the_conversations_labels if {
	d := approval.decision with input as labelled("send_email", "external_irreversible", [
		untrusted_page,
		restricted_document,
		{"label": "restricted", "tool": "read_document", "time": "2026-12-06T10:05:00Z"},
	])
		with data.toolbooth.approval.labels as []
	d.reason == concat("", [
		"the tool's effects are external and irreversible; ",
		"conversation labels: restricted (read_document), untrusted (fetch_page)",
	])
}

test_a_required_reason_without_labels_is_unchanged if {
	every labels in [[], null] {
		d := approval.decision with input as object.union(call_of("send_email", "external_irreversible"),
			{"conversation": {"id": "c1", "labels": labels}})
		d.reason == "the tool's effects are external and irreversible"
	}
	d := approval.decision with input as object.union(call_of("send_email", "external_irreversible"),
		{"conversation": {"id": null}})
	d.reason == "the tool's effects are external and irreversible"
}

test_default_data_untrusted_conversations_need_approval_for_writes if {
	data.toolbooth.approval.labels == ["untrusted"]
	approval.decision.required with input as labelled("write_file", "internal_reversible", [untrusted_page])
	not approval.decision.required with input as labelled("read_document", "none", [untrusted_page])
	not approval.decision.required with input as labelled("write_file", "internal_reversible", [restricted_document])
}
