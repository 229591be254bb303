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
