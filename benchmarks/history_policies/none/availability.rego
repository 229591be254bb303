# Availability for bench_history.py: a tool without an entry in data.toolbooth.tools is available
# (calculate, the benchmark's tool, has none), as the bundled policies decide it.
package toolbooth.availability

import rego.v1

decision := {"allow": true, "reason": "tool is available"} if {
	not data.toolbooth.tools[input.tool.name]
} else := {"allow": false, "reason": "tool is not available"} if {
	roles := data.toolbooth.tools[input.tool.name].roles
	not "*" in roles
	not holds_one_of(roles)
} else := {"allow": true, "reason": "tool is available"}

holds_one_of(roles) if {
	some role in input.principal.roles
	role in roles
}
