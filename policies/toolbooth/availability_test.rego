package toolbooth.availability_test

import rego.v1

import data.toolbooth.availability

call_at(roles, tool, time) := {
	"principal": {"id": "u1", "tenant": "t1", "roles": roles, "permissions": []},
	"tool": {"name": tool, "version": "1.0.0", "side_effect": "none", "permissions": []},
	"context": {"stage": "availability", "time": time},
}

call_by(roles, tool) := call_at(roles, tool, "2026-11-30T15:00:00Z")

office_hours := {"reports": {"hours_utc": {"from": 8, "to": 18}}}

night_shift := {"batch": {"hours_utc": {"from": 22, "to": 6}}}

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
	d == {"allow": false, "reason": "tool is not available"}
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
	d := availability.decision with input as call_by([], "calculate")
		with data.toolbooth.tools as {"calculate": {}}
	d == {"allow": true, "reason": "tool is available"}
}

test_default_data_shows_admin_console_to_admins_only if {
	availability.decision.allow with input as call_by(["admin"], "admin_console")
	not availability.decision.allow with input as call_by(["developer", "reader"], "admin_console")
	availability.decision.allow with input as call_by(["developer"], "calculate")
}

test_no_tool_of_the_default_data_is_restricted_by_time if {
	every entry in data.toolbooth.tools {
		not entry.hours_utc
		not entry.weekdays
	}
}

test_tool_is_available_within_its_hours_and_not_cacheable if {
	d := availability.decision with input as call_at([], "reports", "2026-11-30T15:00:00Z")
		with data.toolbooth.tools as office_hours
	d == {"allow": true, "reason": "tool is available", "cacheable": false}
}

test_hours_include_from_and_exclude_to if {
	availability.decision.allow with input as call_at([], "reports", "2026-11-30T08:00:00Z")
		with data.toolbooth.tools as office_hours
	not availability.decision.allow with input as call_at([], "reports", "2026-11-30T18:00:00Z")
		with data.toolbooth.tools as office_hours
}

test_tool_is_hidden_outside_its_hours if {
	d := availability.decision with input as call_at([], "reports", "2026-11-30T07:59:59Z")
		with data.toolbooth.tools as office_hours
	d == {
		"allow": false,
		"reason": "tool is not available",
		"internal_reason": "outside the tool's time window at 2026-11-30T07:59:59Z",
		"cacheable": false,
	}
}

test_hours_may_span_midnight if {
	availability.decision.allow with input as call_at([], "batch", "2026-11-30T23:00:00Z")
		with data.toolbooth.tools as night_shift
	availability.decision.allow with input as call_at([], "batch", "2026-11-30T05:59:00Z")
		with data.toolbooth.tools as night_shift
	not availability.decision.allow with input as call_at([], "batch", "2026-11-30T06:00:00Z")
		with data.toolbooth.tools as night_shift
	not availability.decision.allow with input as call_at([], "batch", "2026-11-30T12:00:00Z")
		with data.toolbooth.tools as night_shift
}

test_tool_is_available_on_its_weekdays_only if {
	weekdays := {"reports": {"weekdays": ["Monday", "Tuesday"]}}
	availability.decision.allow with input as call_at([], "reports", "2026-11-30T03:00:00Z")
		with data.toolbooth.tools as weekdays
	not availability.decision.allow with input as call_at([], "reports", "2026-12-05T03:00:00Z")
		with data.toolbooth.tools as weekdays
}

test_hours_and_weekdays_must_both_hold if {
	both := {"reports": {"hours_utc": {"from": 8, "to": 18}, "weekdays": ["Monday"]}}
	availability.decision.allow with input as call_at([], "reports", "2026-11-30T09:00:00Z")
		with data.toolbooth.tools as both
	not availability.decision.allow with input as call_at([], "reports", "2026-11-30T19:00:00Z")
		with data.toolbooth.tools as both
	not availability.decision.allow with input as call_at([], "reports", "2026-12-05T09:00:00Z")
		with data.toolbooth.tools as both
}

test_roles_are_checked_before_the_time_window if {
	restricted := {"reports": {"roles": ["admin"], "hours_utc": {"from": 8, "to": 18}}}
	d := availability.decision with input as call_at(["developer"], "reports", "2026-11-30T09:00:00Z")
		with data.toolbooth.tools as restricted
	d == {"allow": false, "reason": "tool is not available"}
	availability.decision.allow with input as call_at(["admin"], "reports", "2026-11-30T09:00:00Z")
		with data.toolbooth.tools as restricted
}
