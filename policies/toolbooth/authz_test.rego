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
