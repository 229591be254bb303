package toolbooth.availability_test

import rego.v1

import data.toolbooth.availability

call_by(roles, tool) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": roles, "permissions": []},
	"tool": {"name": tool, "version": "1.0.0", "side_effect": "none", "permissions": []},
	"context": {"stage": "availability", "time": "2026-11-30T15:00:00Z"},
}

test_unrestricted_tool_is_available if {
	availability.decision.allow with input as call_by(["developer"], "calculate")
		with data.toolbooth.tools as {"admin_console": {"roles": ["admin"]}}
}

test_unrestricted_tool_is_available_without_roles if {
	availability.decision.allow with input as call_by([], "calculate")
		with data.toolbooth.tools as {}
}

test_restricted_tool_is_available_to_listed_role if {
	availability.decision.allow with input as call_by(["reader", "admin"], "admin_console")
		with data.toolbooth.tools as {"admin_console": {"roles": ["admin"]}}
}

test_restricted_tool_is_hidden_from_other_roles if {
	d := availability.decision with input as call_by(["developer"], "admin_console")
		with data.toolbooth.tools as {"admin_console": {"roles": ["admin"]}}
	not d.allow
	d.reason == "tool is not available"
}

test_empty_role_list_hides_tool_from_everyone if {
	not availability.decision.allow with input as call_by(["admin"], "admin_console")
		with data.toolbooth.tools as {"admin_console": {"roles": []}}
}

test_wildcard_role_admits_everyone if {
	availability.decision.allow with input as call_by([], "admin_console")
		with data.toolbooth.tools as {"admin_console": {"roles": ["*"]}}
}

test_entry_without_roles_does_not_restrict if {
	availability.decision.allow with input as call_by([], "calculate")
		with data.toolbooth.tools as {"calculate": {}}
}
