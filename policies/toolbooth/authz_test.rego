package toolbooth.authz_test

import rego.v1

import data.toolbooth.authz

roles := {"reader": ["files:read"], "developer": ["files:read", "files:write"]}

call_with(principal_roles, principal_permissions, required, arguments) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": principal_roles, "permissions": principal_permissions},
	"tool": {"name": "write_file", "version": "1.0.0", "side_effect": "internal_reversible", "permissions": required},
	"call": {"arguments": arguments, "conversation_id": "c1", "idempotency_key": "k"},
	"context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
}

call_by(principal_roles, principal_permissions, required) := call_with(
	principal_roles, principal_permissions, required,
	{"path": "a.txt"},
)

call_naming(arguments) := call_with(["developer"], [], ["files:write"], arguments)

test_tool_without_permissions_is_allowed if {
	d := authz.decision with input as call_by([], [], []) with data.toolbooth.role_permissions as roles
	d.allow
	not d.code
}

test_direct_permission_allows if {
	authz.decision.allow with input as call_by([], ["files:write"], ["files:write"])
		with data.toolbooth.role_permissions as roles
}

test_role_permission_allows if {
	authz.decision.allow with input as call_by(["developer"], [], ["files:read", "files:write"])
		with data.toolbooth.role_permissions as roles
}

test_direct_and_role_permissions_combine if {
	authz.decision.allow with input as call_by(["reader"], ["files:write"], ["files:read", "files:write"])
		with data.toolbooth.role_permissions as roles
}

test_missing_permission_is_denied_and_named if {
	d := authz.decision with input as call_by(["reader"], [], ["files:read", "files:write"])
		with data.toolbooth.role_permissions as roles
	d == {"allow": false, "code": "PERMISSION_DENIED", "reason": "missing permission(s): files:write"}
}

test_all_missing_permissions_are_named_in_order if {
	d := authz.decision with input as call_by([], [], ["z:write", "a:read"])
		with data.toolbooth.role_permissions as roles
	d.reason == "missing permission(s): a:read, z:write"
}

test_unknown_role_grants_nothing if {
	not authz.decision.allow with input as call_by(["intruder"], [], ["files:read"])
		with data.toolbooth.role_permissions as roles
}

test_argument_naming_the_own_tenant_is_allowed if {
	authz.decision.allow with input as call_naming({"path": "a.txt", "tenant_id": "t1"})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant_id"]
}

test_argument_naming_another_tenant_is_not_found if {
	d := authz.decision with input as call_naming({"path": "a.txt", "tenant_id": "t2"})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant_id"]
	d == {
		"allow": false,
		"code": "RESOURCE_NOT_FOUND",
		"reason": "resource not found",
		"internal_reason": `an argument names a tenant other than the principal's ("t1"): tenant_id=t2`,
	}
}

test_every_argument_naming_another_tenant_is_named_internally if {
	d := authz.decision with input as call_naming({"tenant": "t3", "tenant_id": "t2", "owner": "t4"})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant", "tenant_id"]
	endswith(d.internal_reason, `("t1"): tenant=t3, tenant_id=t2`)
}

test_a_tenant_argument_that_is_no_string_is_named_by_its_type if {
	d := authz.decision with input as call_naming({"tenant": 1e+16, "tenant_id": [null, "t2"]})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant", "tenant_id"]
	endswith(d.internal_reason, `("t1"): tenant=<number>, tenant_id=<array>`)
}

test_null_tenant_argument_names_no_tenant if {
	authz.decision.allow with input as call_naming({"path": "a.txt", "tenant_id": null})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant_id"]
}

test_unlisted_arguments_are_not_tenant_checked if {
	authz.decision.allow with input as call_naming({"tenant_name": "t2"})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant_id"]
}

test_missing_permission_is_reported_before_another_tenant if {
	d := authz.decision with input as call_with(["reader"], [], ["files:write"], {"tenant_id": "t2"})
		with data.toolbooth.role_permissions as roles
		with data.toolbooth.tenant_scoped_arguments as ["tenant_id"]
	d.code == "PERMISSION_DENIED"
}

test_default_data_scopes_tenant_and_tenant_id if {
	every name in ["tenant", "tenant_id"] {
		d := authz.decision with input as call_naming({name: "t2"})
		d.code == "RESOURCE_NOT_FOUND"
	}
	authz.decision.allow with input as call_naming({"tenant": "t1", "tenant_id": "t1"})
}

# --- external recipients --------------------------------------------------------------------------

mail_permissions := {"developer": ["email:preview_send"], "admin": ["email:preview_send", "email:send_external"]}

mail_to(principal_roles, arguments) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": principal_roles, "permissions": []},
	"tool": {"name": "send_email_preview", "version": "1.0.0", "side_effect": "none",
	         "permissions": ["email:preview_send"]},
	"call": {"arguments": arguments, "conversation_id": "c1", "idempotency_key": null},
	"context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
}

mail_decision(principal_roles, arguments) := d if {
	d := authz.decision with input as mail_to(principal_roles, arguments)
		with data.toolbooth.role_permissions as mail_permissions
		with data.toolbooth.email.internal_domains as ["Example.com"]
}

test_internal_recipients_need_no_extra_permission if {
	d := mail_decision(["developer"], {
		"recipients": [{"email": "ana@example.com"}, {"email": "Bo@EXAMPLE.COM", "display_name": "Bo"}],
		"cc": ["ops@mail.example.com"],
		"bcc": null,
	})
	d == {"allow": true, "reason": "all required permissions are held"}
}

test_an_external_recipient_needs_the_extra_permission if {
	d := mail_decision(["developer"], {"recipients": [{"email": "ana@example.com"}, {"email": "x@partner.org"}]})
	d == {
		"allow": false,
		"code": "PERMISSION_DENIED",
		"reason": "sending to recipients outside the organization (partner.org) needs permission email:send_external",
	}
}

test_the_extra_permission_allows_external_recipients if {
	mail_decision(["admin"], {"recipients": [{"email": "x@partner.org"}], "cc": ["y@other.net"]}).allow
	d := authz.decision with input as object.union(mail_to([], {"recipients": ["x@partner.org"]}),
		{"principal": {"id": "u1", "tenant": "t1", "roles": [], "permissions": ["email:preview_send",
			"email:send_external"]}})
		with data.toolbooth.role_permissions as mail_permissions
	d.allow
}

test_every_recipient_argument_is_checked_and_each_external_domain_named if {
	d := mail_decision(["developer"], {
		"recipients": [{"email": "ana@example.com"}],
		"cc": "boss@rival.com",
		"bcc": [{"email": "spy@Other.NET"}, "x@rival.com"],
	})
	d.reason == concat("", [
		"sending to recipients outside the organization (other.net, rival.com) ",
		"needs permission email:send_external",
	])
}

test_a_lookalike_domain_is_external if {
	not mail_decision(["developer"], {"recipients": ["a@notexample.com"]}).allow
	not mail_decision(["developer"], {"recipients": ["a@example.com.evil.org"]}).allow
}

test_a_recipient_without_a_domain_is_external if {
	d := mail_decision(["developer"], {"recipients": [{"email": "nobody"}, 42]})
	d.reason == concat("", [
		"sending to recipients outside the organization (an address without a domain) ",
		"needs permission email:send_external",
	])
}

test_tools_without_recipient_arguments_are_not_checked if {
	call := object.union(mail_to(["developer"], {"recipients": ["x@partner.org"]}),
		{"tool": {"name": "create_ticket", "permissions": []}})
	authz.decision.allow with input as call with data.toolbooth.role_permissions as mail_permissions
}

test_a_missing_permission_is_reported_before_external_recipients if {
	d := mail_decision([], {"recipients": ["x@partner.org"]})
	d.reason == "missing permission(s): email:preview_send"
}

test_default_data_developers_send_inside_example_com_only if {
	inside := object.union(mail_to(["developer"], {"recipients": [{"email": "a@example.com"}]}),
		{"tool": {"name": "send_email", "permissions": ["email:send"]}})
	authz.decision.allow with input as inside
	outside := object.union(inside, {"call": {"arguments": {"recipients": [{"email": "a@partner.org"}]}}})
	not authz.decision.allow with input as outside
	admin := object.union(outside, {"principal": {"roles": ["admin"]}})
	authz.decision.allow with input as admin
}

test_default_data_grants_the_reference_tools_permissions if {
	every permission in ["documents:search", "documents:read", "tasks:preview_create", "tasks:create",
		"email:preview_send", "email:send"] {
		d := authz.decision with input as object.union(mail_to(["developer"], {}),
			{"tool": {"name": "t", "permissions": [permission]}})
		d.allow
	}
	every permission in ["documents:search", "documents:read"] {
		authz.decision.allow with input as object.union(mail_to(["reader"], {}),
			{"tool": {"name": "t", "permissions": [permission]}})
	}
	not authz.decision.allow with input as object.union(mail_to(["developer"], {}),
		{"tool": {"name": "t", "permissions": ["email:send_external"]}})
}

# --- the call's history: exfiltration -------------------------------------------------------------

restricted_document := {"label": "restricted", "tool": "read_document", "time": "2026-12-06T10:00:00Z"}

untrusted_page := {"label": "untrusted", "tool": "fetch_page", "time": "2026-12-06T10:01:00Z"}

carrying(call, labels) := object.union(call, {"conversation": {"id": "c1", "labels": labels}})

mail_carrying(principal_roles, arguments, labels) := d if {
	d := authz.decision with input as carrying(mail_to(principal_roles, arguments), labels)
		with data.toolbooth.role_permissions as mail_permissions
		with data.toolbooth.email.internal_domains as ["Example.com"]
		with data.toolbooth.email.no_external_after_labels as ["restricted", "secret"]
}

test_a_listed_label_keeps_mail_inside_the_organization_even_with_the_permission if {
	d := mail_carrying(["admin"], {"recipients": [{"email": "x@partner.org"}]}, [restricted_document])
	d == {
		"allow": false,
		"code": "POLICY_VIOLATION",
		"reason": concat("", [
			`this conversation read data labelled "restricted" (from read_document); `,
			"it may not be sent outside the organization (partner.org)",
		]),
	}
}

test_the_exfiltration_reason_names_every_label_tool_and_domain_sorted if {
	d := mail_carrying(["admin"], {"recipients": ["x@partner.org", "a@example.com"], "cc": "y@Other.net"}, [
		{"label": "secret", "tool": "fetch_page", "time": "2026-12-06T10:02:00Z"},
		{"label": "restricted", "tool": "search_documents", "time": "2026-12-06T10:01:00Z"},
		untrusted_page,
		restricted_document,
	])
	d.code == "POLICY_VIOLATION"
	d.reason == concat("", [
		`this conversation read data labelled "restricted" (from read_document, search_documents), `,
		`"secret" (from fetch_page); it may not be sent outside the organization (other.net, partner.org)`,
	])
}

test_exfiltration_is_refused_before_the_missing_external_permission if {
	d := mail_carrying(["developer"], {"recipients": ["x@partner.org"]}, [restricted_document])
	d.code == "POLICY_VIOLATION"
}

test_missing_permissions_and_other_tenants_come_before_exfiltration if {
	d := mail_carrying([], {"recipients": ["x@partner.org"]}, [restricted_document])
	d.reason == "missing permission(s): email:preview_send"
	other := mail_carrying(["admin"], {"recipients": ["x@partner.org"], "tenant_id": "t2"}, [restricted_document])
	other.code == "RESOURCE_NOT_FOUND"
}

test_internal_recipients_are_allowed_in_a_labelled_conversation if {
	d := mail_carrying(["developer"], {"recipients": [{"email": "a@example.com"}], "cc": ["b@mail.example.com"]},
		[restricted_document])
	d == {"allow": true, "reason": "all required permissions are held"}
}

test_a_labelled_conversation_without_recipients_is_allowed if {
	mail_carrying(["developer"], {"subject": "hi"}, [restricted_document]).allow
	mail_carrying(["developer"], {"recipients": null, "cc": []}, [restricted_document]).allow
	d := authz.decision with input as carrying(call_naming({"path": "a.txt", "recipients": ["x@partner.org"]}),
		[restricted_document])
	d.allow
}

test_an_unlisted_label_does_not_stop_external_mail if {
	mail_carrying(["admin"], {"recipients": ["x@partner.org"]}, [untrusted_page]).allow
	d := mail_carrying(["developer"], {"recipients": ["x@partner.org"]}, [untrusted_page])
	d.code == "PERMISSION_DENIED"
}

test_no_labels_do_not_stop_external_mail if {
	mail_carrying(["admin"], {"recipients": ["x@partner.org"]}, []).allow
	absent := authz.decision with input as mail_to(["admin"], {"recipients": ["x@partner.org"]})
		with data.toolbooth.role_permissions as mail_permissions
	absent.allow
	no_labels := authz.decision with input as object.union(mail_to(["admin"], {"recipients": ["x@partner.org"]}),
		{"conversation": {"id": null}})
		with data.toolbooth.role_permissions as mail_permissions
	no_labels.allow
}

test_default_data_restricted_data_stays_inside if {
	authz.decision.allow with input as carrying(
		object.union(mail_to(["admin"], {"recipients": [{"email": "a@partner.org"}]}),
			{"tool": {"name": "send_email", "permissions": ["email:send"]}}),
		[untrusted_page],
	)
	d := authz.decision with input as carrying(
		object.union(mail_to(["admin"], {"recipients": [{"email": "a@partner.org"}]}),
			{"tool": {"name": "send_email", "permissions": ["email:send"]}}),
		[restricted_document],
	)
	d.code == "POLICY_VIOLATION"
}

# --- the call's history: the loop breaker ---------------------------------------------------------

failure(code) := {"code": code, "time": "2026-12-06T10:00:00Z"}

with_history(call, history) := object.union(call, {"history": history})

write_with(history) := with_history(call_by(["developer"], [], ["files:write"]), history)

failed(codes) := write_with({"meters": {}, "failures": [failure(code) | some code in codes]})

test_two_failures_are_allowed_the_third_is_refused if {
	authz.decision.allow with input as failed(["RESOURCE_NOT_FOUND", "RESOURCE_NOT_FOUND"])
	d := authz.decision with input as failed(["RESOURCE_NOT_FOUND", "RESOURCE_NOT_FOUND", "RESOURCE_NOT_FOUND"])
	d == {
		"allow": false,
		"code": "POLICY_VIOLATION",
		"reason": concat("", [
			"this call failed 3 times in this conversation (RESOURCE_NOT_FOUND): ",
			"stop repeating it; change its arguments or ask the user",
		]),
	}
}

test_failures_with_different_codes_are_not_a_loop if {
	authz.decision.allow with input as failed(["RESOURCE_NOT_FOUND", "TIMEOUT", "INVALID_ARGUMENT"])
	authz.decision.allow with input as failed(["TIMEOUT", "RESOURCE_NOT_FOUND", "TIMEOUT", "RESOURCE_NOT_FOUND"])
}

test_every_code_that_reached_the_threshold_is_named_sorted if {
	d := authz.decision with input as failed(["TIMEOUT", "RESOURCE_NOT_FOUND", "TIMEOUT", "INVALID_ARGUMENT",
		"RESOURCE_NOT_FOUND"])
		with data.toolbooth.history.loop_after_failures as 2
	d.reason == concat("", [
		"this call failed 2 times in this conversation (RESOURCE_NOT_FOUND, TIMEOUT): ",
		"stop repeating it; change its arguments or ask the user",
	])
}

test_the_threshold_comes_from_the_data if {
	authz.decision.allow with input as failed(["TIMEOUT", "TIMEOUT", "TIMEOUT"])
		with data.toolbooth.history.loop_after_failures as 4
	not authz.decision.allow with input as failed(["TIMEOUT", "TIMEOUT", "TIMEOUT", "TIMEOUT"])
		with data.toolbooth.history.loop_after_failures as 4
}

test_no_threshold_breaks_no_loop if {
	authz.decision.allow with input as failed(["TIMEOUT", "TIMEOUT", "TIMEOUT"])
		with data.toolbooth.history as {"meters": {}}
}

test_no_failures_are_no_loop if {
	authz.decision.allow with input as failed([])
	authz.decision.allow with input as write_with({})
	authz.decision.allow with input as call_by(["developer"], [], ["files:write"])
}

test_permission_denials_come_before_the_loop_breaker if {
	d := authz.decision with input as with_history(mail_to(["developer"], {"recipients": ["x@partner.org"]}),
		{"failures": [failure("TIMEOUT"), failure("TIMEOUT"), failure("TIMEOUT")]})
		with data.toolbooth.role_permissions as mail_permissions
	d.code == "PERMISSION_DENIED"
}

# --- the call's history: rate limits --------------------------------------------------------------

meter(count, retry) := {"count": count, "sum": 0, "amount": 0, "window_seconds": 60, "retry_after_seconds": retry}

summed(sum, amount, retry) := {
	"count": 1, "sum": sum, "amount": amount, "window_seconds": 3600,
	"retry_after_seconds": retry,
}

metered(meters) := write_with({"meters": meters, "failures": []})

limits := {
	"writes": {"by": ["principal"], "window_seconds": 60, "limit": 5},
	"tenant_writes": {"by": ["tenant"], "window_seconds": 60, "limit": 20},
	"spend": {"by": ["principal"], "window_seconds": 3600, "sum": "/amount", "limit": 100},
	"counted_only": {"by": ["tool"], "window_seconds": 60},
}

test_a_count_limit_is_reached_when_the_counted_calls_use_it_up if {
	authz.decision.allow with input as metered({"writes": meter(4, 12)}) with data.toolbooth.history.meters as limits
	d := authz.decision with input as metered({"writes": meter(5, 12)}) with data.toolbooth.history.meters as limits
	d == {
		"allow": false,
		"code": "RATE_LIMITED",
		"retry_after_seconds": 12,
		"reason": "rate limit writes reached: 5 calls per 60 seconds; retry in 12 seconds",
	}
}

test_a_sum_limit_is_passed_by_this_calls_amount if {
	authz.decision.allow with input as metered({"spend": summed(80, 20, 7)})
		with data.toolbooth.history.meters as limits
	d := authz.decision with input as metered({"spend": summed(80, 21, 7)})
		with data.toolbooth.history.meters as limits
	d == {
		"allow": false,
		"code": "RATE_LIMITED",
		"retry_after_seconds": 7,
		"reason": "rate limit spend reached: 100 per 3600 seconds; retry in 7 seconds",
	}
}

test_a_sum_limit_ignores_the_count if {
	authz.decision.allow with input as metered({"spend": object.union(summed(0, 1, 7), {"count": 500})})
		with data.toolbooth.history.meters as limits
}

test_a_limit_that_is_not_whole_is_shown_to_two_decimals if {
	d := authz.decision with input as metered({"spend": summed(2, 1, 7)})
		with data.toolbooth.history.meters as {"spend": object.union(limits.spend, {"limit": 2.5})}
	d.reason == "rate limit spend reached: 2.50 per 3600 seconds; retry in 7 seconds"
	authz.numeral(30) == "30"
	authz.numeral(0.125) == "0.13"
	authz.numeral(-1.5) == "-1.50"
	authz.numeral(1e3) == "1000"
}

test_every_exceeded_meter_is_named_and_the_longest_wait_given if {
	d := authz.decision with input as metered({
		"writes": meter(9, 12),
		"spend": summed(100, 1, 30),
		"tenant_writes": meter(3, 59),
	})
		with data.toolbooth.history.meters as limits
	d.retry_after_seconds == 30
	d.reason == concat("", [
		"rate limit spend reached: 100 per 3600 seconds; ",
		"rate limit writes reached: 5 calls per 60 seconds; retry in 30 seconds",
	])
}

test_the_wait_is_at_least_a_second if {
	d := authz.decision with input as metered({"writes": meter(0, 0)})
		with data.toolbooth.history.meters as {"writes": {"by": ["principal"], "window_seconds": 60, "limit": 0}}
	d.retry_after_seconds == 1
	d.reason == "rate limit writes reached: 0 calls per 60 seconds; retry in 1 second"
}

test_one_is_singular_in_a_reason if {
	d := authz.decision with input as metered({"writes": meter(1, 1)})
		with data.toolbooth.history.meters as {"writes": {"by": ["principal"], "window_seconds": 1, "limit": 1}}
	d.reason == "rate limit writes reached: 1 call per 1 second; retry in 1 second"
	loop := authz.decision with input as failed(["TIMEOUT"]) with data.toolbooth.history.loop_after_failures as 1
	startswith(loop.reason, "this call failed 1 time in this conversation (TIMEOUT): ")
}

test_meters_without_a_limit_never_limit if {
	authz.decision.allow with input as metered({"counted_only": meter(10000, 5)})
		with data.toolbooth.history.meters as limits
	authz.decision.allow with input as metered({"undeclared": meter(10000, 5)})
		with data.toolbooth.history.meters as limits
	authz.decision.allow with input as metered({"writes": meter(10000, 5)})
		with data.toolbooth.history.meters as {"writes": {"by": ["principal"], "window_seconds": 60, "limit": null}}
}

test_no_meters_limit_nothing if {
	authz.decision.allow with input as metered({})
	authz.decision.allow with input as write_with({"failures": []})
}

test_the_loop_breaker_comes_before_rate_limits if {
	call := write_with({"meters": {"writes": meter(5, 12)}, "failures": [
		failure("TIMEOUT"), failure("TIMEOUT"), failure("TIMEOUT"),
	]})
	d := authz.decision with input as call with data.toolbooth.history.meters as limits
	d.code == "POLICY_VIOLATION"
}

test_default_data_thirty_writes_per_principal_a_minute if {
	authz.decision.allow with input as metered({"writes_per_principal": meter(29, 41)})
	d := authz.decision with input as metered({"writes_per_principal": meter(30, 41)})
	d == {
		"allow": false,
		"code": "RATE_LIMITED",
		"retry_after_seconds": 41,
		"reason": "rate limit writes_per_principal reached: 30 calls per 60 seconds; retry in 41 seconds",
	}
}

test_default_data_history_values if {
	data.toolbooth.history.meters.writes_per_principal == {
		"by": ["principal"], "window_seconds": 60,
		"side_effects": ["internal_reversible", "external_reversible", "external_irreversible"], "limit": 30,
		"facts": "reached",
	}
	data.toolbooth.history.loop_after_failures == 3
	data.toolbooth.email.no_external_after_labels == ["restricted"]
}
