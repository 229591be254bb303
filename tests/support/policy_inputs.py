"""Hypothesis strategies for policy inputs of the documented contract (``docs/policy-input.schema.json``).

Values lean to what the default policies look at — tenants differing only in case, roles and permissions near
the data's, email recipients inside and outside ``example.com``, arguments null or empty, nested JSON, times on
the edges of a time window — with arbitrary text and JSON besides. ``WINDOWED_TOOLS`` gives some tools of the
data time windows (and odd entries) for the availability rule to decide on.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import strategies as st

__all__ = ["WINDOWED_TOOLS", "approver_input", "stage_input"]

WINDOWED_TOOLS = {
    "night_batch": {"roles": ["*"], "hours_utc": {"from": 22, "to": 6}},
    "reports": {"roles": ["developer", "approver"], "hours_utc": {"from": 8, "to": 18},
                "weekdays": ["Monday", "Friday"]},
    "weekend_jobs": {"weekdays": ["Saturday", "Sunday"]},
    "closed": {"roles": []},
    "empty_window": {"roles": ["*"], "hours_utc": {"from": 8, "to": 8}},
    "odd_entry": {"roles": None, "hours_utc": {"from": "8", "to": 18}, "weekdays": "Monday"},
}
_TOOLS = [*WINDOWED_TOOLS, "admin_console", "send_email", "send_email_preview", "create_task", "calculate", "x"]
_TENANTS = ["acme", "ACME", "Acme", "t1", "T1", "", " acme"]
_IDS = ["alice", "Alice", "bob", "a"]
_ROLES = ["admin", "Admin", "developer", "reader", "approver", "APPROVER", "*", ""]
_PERMISSIONS = ["files:read", "files:write", "email:send", "email:send_external", "Email:Send_External",
                "admin:console", "tasks:create", "documents:read", ""]
_ADDRESSES = ["a@example.com", "b@Example.COM", "c@mail.example.com", "d@example.com.evil.org", "e@evil.org",
              "f@notexample.com", "no-at-sign", "", "g@", "@example.com", " h@example.com ", "i@x@example.com"]
_TIMES = ["2026-11-30T07:59:59Z", "2026-11-30T08:00:00Z", "2026-11-30T17:59:59Z", "2026-11-30T18:00:00Z",
          "2026-11-30T22:00:00Z", "2026-12-05T05:59:59Z", "2026-12-06T06:00:00Z", "2026-02-29T12:00:00Z",
          "", "not a time", "2026-13-01T00:00:00Z"]
_SIDE_EFFECTS = ["none", "internal_reversible", "external_reversible", "external_irreversible"]

_texts = st.one_of(st.sampled_from(["", " ", "null", "ACME", "é", "%q", "a=b, c"]), st.text(max_size=6))
_leaves = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False, allow_infinity=False), _texts)
_json = st.recursive(_leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(_texts, inner, max_size=3)), max_leaves=6)
_tenants = st.one_of(st.sampled_from(_TENANTS), _texts)
_recipient = st.one_of(st.sampled_from(_ADDRESSES),
                       st.fixed_dictionaries({"email": st.one_of(st.sampled_from(_ADDRESSES), _leaves)}), _json)
_recipients = st.one_of(st.none(), _recipient, st.lists(_recipient, max_size=4))
_arguments = st.fixed_dictionaries({}, optional={
    "tenant": st.one_of(_tenants, _json), "tenant_id": _tenants, "recipients": _recipients, "cc": _recipients,
    "bcc": _recipients, "subject": _texts, "nested": _json,
})
_times = st.one_of(
    st.sampled_from(_TIMES),
    st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2100, 1, 1)).map(lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")),
)
_optional_text = st.one_of(st.none(), _texts)


def _principal() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "id": st.one_of(st.sampled_from(_IDS), st.text(min_size=1, max_size=6)), "tenant": _tenants,
        "roles": st.lists(st.one_of(st.sampled_from(_ROLES), _texts), max_size=3),
        "permissions": st.lists(st.one_of(st.sampled_from(_PERMISSIONS), _texts), max_size=3),
    })


def stage_input(stage: str) -> st.SearchStrategy[dict[str, Any]]:
    """An input of ``data.toolbooth.<stage>.decision``: ``call`` for authz and approval only."""
    parts = {
        "principal": _principal(),
        "tool": st.fixed_dictionaries({
            "name": st.sampled_from(_TOOLS), "version": st.sampled_from(["1.0.0", "2"]),
            "side_effect": st.sampled_from(_SIDE_EFFECTS),
            "permissions": st.lists(st.sampled_from([p for p in _PERMISSIONS if p]), max_size=3),
            "plugin": st.sampled_from(["tests", ""]),
        }),
        "context": st.fixed_dictionaries({"stage": st.just(stage), "time": _times,
                                          "conversation_id": _optional_text}),
    }
    if stage != "availability":
        parts["call"] = st.fixed_dictionaries({"arguments": _arguments, "conversation_id": _optional_text,
                                               "idempotency_key": _optional_text})
    return st.fixed_dictionaries(parts)


def approver_input() -> st.SearchStrategy[dict[str, Any]]:
    """An input of ``data.toolbooth.approval.approver``: the approver and the preview of a call."""
    return st.fixed_dictionaries({
        "principal": _principal(),
        "preview": st.fixed_dictionaries({
            "preview_id": _texts, "tool": st.sampled_from(_TOOLS), "tool_version": st.just("1.0.0"),
            "requested_by": st.fixed_dictionaries({"id": st.sampled_from(_IDS), "tenant": _tenants}),
            "approver_roles": st.lists(st.sampled_from(_ROLES), max_size=3), "reason": _texts,
        }),
    })
