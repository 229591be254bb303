# Authorization for bench_history.py's labels config: none/authz.rego's permission check, then
# the rule of the meter+labels config on the conversation alone (a conversation carrying the label
# "restricted" is refused, POLICY_VIOLATION). Its data declares no meter.
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
