# Authorization for bench_history.py's meter+labels config: none/authz.rego's permission
# check, then two rules that read the call's history: a conversation carrying the label
# "restricted" is refused (POLICY_VIOLATION), and a call the meter calls_per_principal
# (data.toolbooth.history.meters) has counted up to its limit is refused (RATE_LIMITED).
# The benchmark's calls meet neither: its conversation carries no label and the limit is far
# above the calls it makes; each call is counted, reads its conversation, and is allowed.
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
	"code": "POLICY_VIOLATION",
	"reason": "this conversation read restricted data",
} if {
	some carried in input.conversation.labels
	carried.label == "restricted"
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
