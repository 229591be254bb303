# Approval: does this call need a human to approve it first?
#
# Required for tools whose effects are external and irreversible, for every tool
# listed in data.toolbooth.approval.tools, and for calls that give a value to an
# argument data.toolbooth.approval.sensitive_arguments lists for their tool (null,
# "", [] and {} give none). A required decision carries who may approve and how
# long its preview lives: approver_roles and preview_ttl_seconds of
# data.toolbooth.approval, when set there.
#
# Labels: a call with side effects (side_effect other than "none") in a
# conversation carrying a label listed in data.toolbooth.approval.labels
# (input.conversation.labels: what earlier results brought in, each with the tool
# that brought it) needs approval, one reason per label and tool. A required
# decision's reason ends with every label the conversation carries, so the approver
# sees them: "...; conversation labels: restricted (read_document), untrusted
# (fetch_page)". Without input.conversation (a policy set that reads no history),
# the conversation carries no labels.
package toolbooth.approval

import rego.v1

default decision := {"required": false, "reason": "no approval needed"}

decision := object.union(
	{"required": true, "reason": concat("; ", array.concat(sort(reasons), labels_shown))},
	parameters,
) if count(reasons) > 0

# The conversation's labels, as the end of a required decision's reason: none, or one part naming them all.
labels_shown := [sprintf("conversation labels: %s", [concat(", ", sort(carried))])] if {
	is_array(input.conversation.labels)
	carried := {sprintf("%s (%s)", [shown(label.label), shown(label.tool)]) | some label in input.conversation.labels}
	count(carried) > 0
} else := []

# A label or tool as a reason shows it: a string as it is, any other value by its type.
shown(value) := value if {
	is_string(value)
} else := sprintf("<%s>", [type_name(value)])

# Who may approve and how long a preview lives, when the data sets them. The data
# shares its path with this package: refer to its keys, never to the whole object.
parameters := object.union(
	{"approver_roles": roles | roles := data.toolbooth.approval.approver_roles},
	{"preview_ttl_seconds": ttl | ttl := data.toolbooth.approval.preview_ttl_seconds},
)

reasons contains "the tool's effects are external and irreversible" if {
	input.tool.side_effect == "external_irreversible"
}

reasons contains "approval is configured for this tool" if {
	input.tool.name in data.toolbooth.approval.tools
}

reasons contains sprintf("the conversation carries %q (from %s)", [carried.label, shown(carried.tool)]) if {
	input.tool.side_effect != "none"
	is_array(input.conversation.labels)
	some carried in input.conversation.labels
	carried.label in data.toolbooth.approval.labels
}

reasons contains sprintf("approval is configured for argument %q", [name]) if {
	some name in data.toolbooth.approval.sensitive_arguments[input.tool.name]
	value := input.call.arguments[name]
	not value in {null, "", [], {}}
}

# Who may approve or deny a preview (input: principal = the approver, preview =
# {preview_id, tool, tool_version, requested_by {id, tenant}, approver_roles, reason}):
# someone of the call's tenant who holds one of the preview's approver_roles and is
# not the principal who made the call.
default approver := {"allow": false, "reason": "approving this call needs one of its approver roles"}

approver := {"allow": false, "reason": "nobody may approve their own call"} if {
	input.principal.id == input.preview.requested_by.id
	input.principal.tenant == input.preview.requested_by.tenant
} else := {"allow": false, "reason": "the call belongs to another tenant"} if {
	input.principal.tenant != input.preview.requested_by.tenant
} else := {"allow": true, "reason": "the approver holds one of the call's approver roles"} if {
	some role in input.preview.approver_roles
	role in input.principal.roles
}
