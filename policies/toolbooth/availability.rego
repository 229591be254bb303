# Availability: may this principal see, and so call, this tool?
#
# A tool is available unless its entry in data.toolbooth.tools restricts it:
#   "roles": ["admin"]                  only to principals holding one of these
#                                       roles ("*" admits everyone, [] nobody);
#   "hours_utc": {"from": 8, "to": 18}  only from hour `from` until hour `to`, UTC
#                                       (from > to spans midnight: 22 to 6);
#   "weekdays": ["Monday", "Friday"]    only on these days, UTC.
# A hidden tool looks exactly like an unknown one, so the public reason never
# names roles or hours. A decision that depends on the time is not cacheable.
#
# Asked for every call and every listed tool, so it is written to be cheap: one
# `else` chain stops at the first branch that holds (tools without an entry stop
# at the first), and it looks the entry up inline, since each rule it referred
# to would cost an evaluation.
package toolbooth.availability

import rego.v1

decision := {"allow": true, "reason": "tool is available"} if {
	not data.toolbooth.tools[input.tool.name]
} else := {"allow": false, "reason": "tool is not available"} if {
	roles := data.toolbooth.tools[input.tool.name].roles
	not "*" in roles
	not holds_one_of(roles)
} else := {"allow": true, "reason": "tool is available"} if {
	not data.toolbooth.tools[input.tool.name].hours_utc
	not data.toolbooth.tools[input.tool.name].weekdays
} else := {"allow": true, "reason": "tool is available", "cacheable": false} if {
	in_hours
	on_weekday
} else := {
	"allow": false,
	"reason": "tool is not available",
	"internal_reason": sprintf("outside the tool's time window at %s", [input.context.time]),
	"cacheable": false,
}

holds_one_of(roles) if {
	some role in input.principal.roles
	role in roles
}

# The time window, evaluated only for tools that have one.
entry := data.toolbooth.tools[input.tool.name]

in_hours if not entry.hours_utc

in_hours if {
	entry.hours_utc.from <= entry.hours_utc.to
	between(entry.hours_utc.from, hour, entry.hours_utc.to)
}

in_hours if {
	entry.hours_utc.from > entry.hours_utc.to
	not between(entry.hours_utc.to, hour, entry.hours_utc.from)
}

between(low, value, high) if {
	low <= value
	value < high
}

on_weekday if not entry.weekdays

on_weekday if time.weekday(now) in entry.weekdays

now := time.parse_rfc3339_ns(input.context.time)

hour := time.clock(now)[0]
