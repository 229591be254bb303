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
# Exfiltration: a call naming a recipient outside the organization (as above) in
# a conversation that carries a label listed in
# data.toolbooth.email.no_external_after_labels (input.conversation.labels: what
# earlier results brought in, each with the tool that brought it) is refused as
# POLICY_VIOLATION, even when the principal holds the external permission. The
# reason names the labels, the tools that brought them and the external domains.
#
# Loop breaker: a call that has already failed
# data.toolbooth.history.loop_after_failures times with the same code in this
# conversation (input.history.failures: earlier failures of the same tool with the
# same arguments) is refused as POLICY_VIOLATION, naming the code(s).
#
# Rate limit: a meter of input.history.meters whose declaration in
# data.toolbooth.history.meters has a "limit" is exceeded when this call would
# pass it: for a meter declared with "sum", when sum + amount > limit; otherwise
# when count >= limit (the calls already counted use the limit up). The call is
# refused as RATE_LIMITED with retry_after_seconds, the longest wait of the
# exceeded meters (at least 1); the reason names every exceeded meter.
#
# The history and the conversation are only in the input when the policy set reads
# them: absent, there are no labels, no failures and no meters.
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
	"code": "POLICY_VIOLATION",
	"reason": sprintf("this conversation read data labelled %s; it may not be sent outside the organization (%s)", [
		concat(", ", sort(exfiltrating_labels)),
		concat(", ", sort(external_domains)),
	]),
} if {
	is_array(input.conversation.labels)
	some carried in input.conversation.labels
	carried.label in data.toolbooth.email.no_external_after_labels
	some name in data.toolbooth.email.recipient_arguments[input.tool.name]
	some recipient in as_list(input.call.arguments[name])
	not internal_recipient(recipient)
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
} else := {
	"allow": false,
	"code": "POLICY_VIOLATION",
	"reason": sprintf("this call failed %s in this conversation (%s): %s", [
		quantity(data.toolbooth.history.loop_after_failures, "time"),
		concat(", ", sort(looping_codes)),
		"stop repeating it; change its arguments or ask the user",
	]),
} if {
	is_array(input.history.failures)
	count(input.history.failures) >= data.toolbooth.history.loop_after_failures
	is_number(data.toolbooth.history.loop_after_failures)
	count(looping_codes) > 0
} else := {
	"allow": false,
	"code": "RATE_LIMITED",
	"retry_after_seconds": retry_after_seconds,
	"reason": sprintf("%s; retry in %s", [concat("; ", sort(limits_reached)), quantity(retry_after_seconds, "second")]),
} if {
	is_object(input.history.meters)
	some name, meter in input.history.meters
	exceeded(name, meter)
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

# --- history ----------------------------------------------------------------------------------------

# Each listed label the conversation carries, with the tools that brought it: "restricted" (from read_document).
exfiltrating_labels contains sprintf("%q (from %s)", [label, concat(", ", sort(tools))]) if {
	some carried in input.conversation.labels
	carried.label in data.toolbooth.email.no_external_after_labels
	label := carried.label
	tools := {shown(other.tool) | some other in input.conversation.labels; other.label == label}
}

# The codes this call has failed with at least loop_after_failures times.
looping_codes contains code if {
	some failure in input.history.failures
	code := failure.code
	count([1 | some other in input.history.failures; other.code == code]) >= data.toolbooth.history.loop_after_failures
}

# A meter passes its limit, when its declaration sets one: its sum with this call's amount, for a meter
# that sums; else its count (this call would be one more).
exceeded(name, meter) if {
	declared := data.toolbooth.history.meters[name]
	is_number(declared.limit)
	declared.sum
	meter.sum + meter.amount > declared.limit
}

exceeded(name, meter) if {
	declared := data.toolbooth.history.meters[name]
	is_number(declared.limit)
	not declared.sum
	meter.count >= declared.limit
}

exceeded_meters[name] := meter if {
	some name, meter in input.history.meters
	exceeded(name, meter)
}

# The longest wait until every exceeded meter has room again, in whole seconds, at least 1.
retry_after_seconds := ceil(max({1} | {meter.retry_after_seconds |
	some meter in exceeded_meters
	is_number(meter.retry_after_seconds)
}))

# What each exceeded meter allows: "rate limit writes_per_principal reached: 30 calls per 60 seconds".
limits_reached contains sprintf("rate limit %s reached: %s per %s", [
	name,
	allowed(declared),
	quantity(declared.window_seconds, "second"),
]) if {
	some name, _ in exceeded_meters
	declared := data.toolbooth.history.meters[name]
}

# What a limit allows: a sum, for a meter that sums an argument; else calls.
allowed(declared) := numeral(declared.limit) if {
	declared.sum
} else := quantity(declared.limit, "call")

# "1 second", "41 seconds".
quantity(value, unit) := sprintf("%s %s", [numeral(value), unit]) if {
	value == 1
} else := sprintf("%s %ss", [numeral(value), unit])

# A number as a reason shows it: whole, else to two decimals (%v writes numbers differently in OPA and in
# regorus, and %d takes whole numbers only).
numeral(value) := format_int(value, 10) if {
	value == floor(value)
} else := sprintf("%s%s.%s", [sign(value), format_int(floor(hundredths / 100), 10), cents]) if {
	hundredths := round(abs(value) * 100)
	cents := substring(format_int(100 + (hundredths % 100), 10), 1, 2)
}

sign(value) := "-" if value < 0
else := ""
