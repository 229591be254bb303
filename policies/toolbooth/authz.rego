# Authorization: may this principal make this call?
#
# Allowed iff every permission the tool requires (input.tool.permissions) is
# held, directly (input.principal.permissions) or through one of the principal's
# roles (data.toolbooth.role_permissions[role]). The deny reason names the
# missing permissions; it is shown to the model.
package toolbooth.authz

import rego.v1

default decision := {"allow": false, "code": "PERMISSION_DENIED", "reason": "permission check failed"}

decision := {"allow": true, "reason": "all required permissions are held"} if count(missing) == 0

decision := {
	"allow": false,
	"code": "PERMISSION_DENIED",
	"reason": sprintf("missing permission(s): %s", [concat(", ", sort(missing))]),
} if count(missing) > 0

granted contains permission if some permission in input.principal.permissions

granted contains permission if {
	some role in input.principal.roles
	some permission in data.toolbooth.role_permissions[role]
}

missing contains permission if {
	some permission in input.tool.permissions
	not permission in granted
}
