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
# External recipients: the arguments data.toolbooth.email.recipient_arguments
# lists for a tool name recipients (a list, or one value; each an address or an
# object with "email"). A recipient whose domain is not one of
# data.toolbooth.email.internal_domains (or a subdomain of one) is external, and
# the call needs data.toolbooth.email.external_permission (a recipient without an
# "@" counts as external). The reason names the external domains.
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
} else := {
	"allow": false,
	"code": "PERMISSION_DENIED",
	"reason": sprintf("sending to recipients outside the organization (%s) needs permission %s", [
		concat(", ", sort(external_domains)),
		data.toolbooth.email.external_permission,
	]),
} if {
	some name in data.toolbooth.email.recipient_arguments[input.tool.name]
	some recipient in as_list(input.call.arguments[name])
	not internal_recipient(recipient)
	not data.toolbooth.email.external_permission in granted
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

other_tenants contains sprintf("%s=%s", [name, shown(value)]) if {
	some name in data.toolbooth.tenant_scoped_arguments
	value := input.call.arguments[name]
	value != null
	value != input.principal.tenant
}

# An argument's value as a reason shows it: a string as it is, any other value by its
# type (%v writes numbers and nested values differently in OPA and in regorus).
shown(value) := value if {
	is_string(value)
} else := sprintf("<%s>", [type_name(value)])

# The recipients of one argument: a list, one value, or none (null).
as_list(value) := value if {
	is_array(value)
} else := [] if {
	value == null
} else := [value]

address(recipient) := recipient if is_string(recipient)

address(recipient) := recipient.email if is_object(recipient)

domain(recipient) := lower(trim_space(parts[count(parts) - 1])) if {
	parts := split(address(recipient), "@")
	count(parts) > 1
}

domain_or_none(recipient) := found if {
	found := domain(recipient)
} else := "an address without a domain"

internal_recipient(recipient) if {
	some own in data.toolbooth.email.internal_domains
	lower(own) == domain(recipient)
}

internal_recipient(recipient) if {
	some own in data.toolbooth.email.internal_domains
	endswith(domain(recipient), concat("", [".", lower(own)]))
}

external_domains contains domain_or_none(recipient) if {
	some name in data.toolbooth.email.recipient_arguments[input.tool.name]
	some recipient in as_list(input.call.arguments[name])
	not internal_recipient(recipient)
}
