# Approval for bench_history.py: required for tools whose effects are external and
# irreversible and for the tools data.toolbooth.approval.tools lists (calculate: neither).
package toolbooth.approval

import rego.v1

default decision := {"required": false, "reason": "no approval needed"}

decision := {"required": true, "reason": concat("; ", sort(reasons))} if count(reasons) > 0

reasons contains "the tool's effects are external and irreversible" if {
	input.tool.side_effect == "external_irreversible"
}

reasons contains "approval is configured for this tool" if {
	input.tool.name in data.toolbooth.approval.tools
}
