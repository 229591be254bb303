# Authorization: may this principal make this call?
#
# Permissions: every permission the tool requires (input.tool.permissions) must be
# held, directly (input.principal.permissions) or through one of the principal's
# roles (data.toolbooth.role_permissions[role]). The deny reason names the missing
# permissions; it is shown to the model.
#
# Tenant isolation: an argument listed in data.toolbooth.tenant_scoped_arguments
# names a tenant's resource, so its validated value must be the principal's
# tenant (null names none). A call naming another tenant is denied as
# RESOURCE_NOT_FOUND, so that another tenant's resources look like absent ones;
# only the internal reason, for the audit log, says which argument did not match.
#
# Asked for every call, so it is written to be cheap: one `else` chain checks the
# denials in order and allows when none holds; the sets that name what is wrong
# are only computed for a denial.
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
	"code": "RESOURCE_NOT_FOUND",
	"reason": "resource not found",
	"internal_reason": sprintf("an argument names a tenant other than the principal's (%q): %s", [
		input.principal.tenant,
		concat(", ", sort(other_tenants)),
	]),
} if {
	some name in data.toolbooth.tenant_scoped_arguments
	value := input.call.arguments[name]
	value != null
	value != input.principal.tenant
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

other_tenants contains sprintf("%s=%v", [name, value]) if {
	some name in data.toolbooth.tenant_scoped_arguments
	value := input.call.arguments[name]
	value != null
	value != input.principal.tenant
}
