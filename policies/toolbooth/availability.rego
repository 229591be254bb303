# Availability: may this principal see, and so call, this tool?
#
# A tool is available unless data.toolbooth.tools[<name>].roles restricts it;
# then the principal must hold one of those roles ("*" admits every principal,
# an empty list admits nobody). A hidden tool looks exactly like an unknown one,
# so the deny reason never names roles.
package toolbooth.availability

import rego.v1

default decision := {"allow": false, "reason": "tool is not available"}

decision := {"allow": true, "reason": "tool is available"} if not data.toolbooth.tools[input.tool.name].roles

decision := {"allow": true, "reason": "tool is available"} if {
	some role in data.toolbooth.tools[input.tool.name].roles
	admits(role)
}

admits(role) if role == "*"

admits(role) if role in input.principal.roles
