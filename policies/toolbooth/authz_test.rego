package toolbooth.authz_test

import rego.v1

import data.toolbooth.authz

roles := {"reader": ["files:read"], "developer": ["files:read", "files:write"]}

call_by(principal_roles, principal_permissions, required) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": principal_roles, "permissions": principal_permissions},
	"tool": {"name": "write_file", "version": "1.0.0", "side_effect": "internal_reversible", "permissions": required},
	"call": {"arguments": {"path": "a.txt"}, "conversation_id": "c1", "idempotency_key": "k"},
	"context": {"stage": "authz", "time": "2026-11-30T15:00:00Z", "conversation_id": "c1"},
}

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
