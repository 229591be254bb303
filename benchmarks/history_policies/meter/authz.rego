# Authorization for bench_history.py's meter config: none/authz.rego's permission check, then
# the combined config's rule on the meter calls_per_principal alone (a call it has counted up
# to its limit is refused, RATE_LIMITED). It reads nothing else of a call's past.
package toolbooth.authz

import rego.v1

decision := {
	"allow": false,
	"code": "PERMISSION_DENIED",
	"reason": sprintf("missing permission(s): %s", [concat(", ", sort(missing))]),
} if {
	some permission in input.tool.permissions
	not permission in granted
} else := {
	"allow": false,
	"code": "RATE_LIMITED",
	"retry_after_seconds": max({1, meter.retry_after_seconds}),
	"reason": sprintf("rate limit calls_per_principal reached: %d calls per %d seconds", [limit, meter.window_seconds]),
} if {
	meter := input.history.meters.calls_per_principal
	limit := data.toolbooth.history.meters.calls_per_principal.limit
	meter.count >= limit
} else := {"allow": true, "reason": "all required permissions are held"}

granted contains permission if some permission in input.principal.permissions

granted contains permission if {
	some role in input.principal.roles
	some permission in data.toolbooth.role_permissions[role]
}

missing contains permission if {
	some permission in input.tool.permissions
	not permission in granted
}
