# Authorization for bench_history.py: every permission the tool requires must be held,
# directly or through a role (calculate requires none), as the bundled policies decide it.
# This set reads nothing of a call's past: the sidecar computes none of it.
package toolbooth.authz

import rego.v1

decision := {
	"allow": false,
	"code": "PERMISSION_DENIED",
	"reason": sprintf("missing permission(s): %s", [concat(", ", sort(missing))]),
} if {
	some permission in input.tool.permissions
	not permission in granted
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
