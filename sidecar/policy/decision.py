"""Decision documents: the questions a policy answers (``Stage``), their rules, and the checked answers.

Three questions, three Rego packages, each answering with a decision document
(not a bare boolean) at the rule ``decision`` (``docs/policies.md``):

* ``data.toolbooth.availability.decision`` -> ``{"allow": bool, "reason"?, "internal_reason"?}``
* ``data.toolbooth.authz.decision`` -> ``{"allow": bool, "code"?, "reason"?, "internal_reason"?,
  "retry_after_seconds"?: int}`` (``code``, only on a deny: ``PERMISSION_DENIED``, ``RESOURCE_NOT_FOUND``,
  ``POLICY_VIOLATION``, or ``RATE_LIMITED``, which alone may say when to try again: ``retry_after_seconds``)
* ``data.toolbooth.approval.decision`` -> ``{"required": bool, "reason"?, "internal_reason"?,
  "approver_roles"?: [str], "preview_ttl_seconds"?: int}``

and one more rule, outside any call, when someone approves or denies a preview
(``sidecar.pipeline.approvals``): ``data.toolbooth.approval.approver`` -> ``{"allow": bool, "reason"?}``.
``data.toolbooth.audit.mask`` (tool name -> JSON pointers) names what the audit log masks.

Any decision may say ``"cacheable": false`` (e.g. one that depends on the time):
it is then never answered from the decision cache.

A decision of the wrong shape raises ``MalformedDecisionError`` -> ``INTERNAL_ERROR``,
not retryable (retrying cannot fix a policy bug).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.contract import ErrorCode
from sidecar.errors import MalformedDecisionError

__all__ = ["AUDIT_MASK_RULE", "CALL_STAGES", "MAX_PREVIEW_TTL_SECONDS", "RULES", "Decision", "Stage",
           "parse_audit_masks", "parse_decision"]


class Stage(StrEnum):
    """Which question a decision answers. A call's stages are named after their Rego package under
    ``toolbooth``; ``APPROVER`` (may this principal approve that preview?) is a rule of ``approval``."""

    AVAILABILITY = "availability"
    AUTHZ = "authz"
    APPROVAL = "approval"
    APPROVER = "approver"


CALL_STAGES = (Stage.AVAILABILITY, Stage.AUTHZ, Stage.APPROVAL)
AUDIT_MASK_RULE = "data.toolbooth.audit.mask"
RULES = {**{stage: f"data.toolbooth.{stage.value}.decision" for stage in CALL_STAGES},
         Stage.APPROVER: "data.toolbooth.approval.approver"}
MAX_PREVIEW_TTL_SECONDS = 7 * 24 * 3600
_FLAGS = {Stage.AVAILABILITY: "allow", Stage.AUTHZ: "allow", Stage.APPROVAL: "required", Stage.APPROVER: "allow"}
_CODES = (ErrorCode.PERMISSION_DENIED.value, ErrorCode.RESOURCE_NOT_FOUND.value, ErrorCode.POLICY_VIOLATION.value,
          ErrorCode.RATE_LIMITED.value)
MAX_RETRY_AFTER_SECONDS = 366 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Decision:
    """A well-typed decision. ``allow`` answers availability/authz, ``required`` approval.

    ``reason`` may reach the model; ``internal_reason`` only reaches the audit log.
    """

    allow: bool = False
    required: bool = False
    code: ErrorCode | None = None
    reason: str = ""
    internal_reason: str = ""
    approver_roles: tuple[str, ...] = ()
    preview_ttl_seconds: int | None = None
    retry_after_seconds: int | None = None
    cacheable: bool = True

    def document(self) -> dict[str, Any]:
        """The decision as JSON data for the audit log (defaults left out)."""
        fields = {"allow": self.allow, "required": self.required, "code": self.code, "reason": self.reason,
                  "internal_reason": self.internal_reason, "approver_roles": list(self.approver_roles),
                  "preview_ttl_seconds": self.preview_ttl_seconds, "retry_after_seconds": self.retry_after_seconds,
                  "cacheable": not self.cacheable}
        document = {name: value for name, value in fields.items() if value}
        if not self.cacheable:
            document["cacheable"] = False
        return document


def parse_decision(stage: Stage, value: Any) -> Decision:
    """Check a decision document's shape; anything malformed raises ``MalformedDecisionError``."""
    rule = RULES[stage]
    if not isinstance(value, dict):
        shape = "undefined or null" if value is None else f"a {type(value).__name__}, not an object"
        raise MalformedDecisionError(f"{rule} is {shape}")
    flag = _FLAGS[stage]
    _expect(rule, value, flag, bool, "a boolean", required=True)
    code = _expect(rule, value, "code", str, f"one of {', '.join(_CODES)}")
    if code is not None and code not in _CODES:
        raise MalformedDecisionError(f"{rule}.code must be one of {', '.join(_CODES)} or absent, got {code!r}")
    if code is not None and value[flag]:
        raise MalformedDecisionError(f"{rule} conflicts: {flag} is true but a deny code {code!r} is set")
    roles = _expect(rule, value, "approver_roles", list, "a list of role names") or []
    if not all(isinstance(role, str) and role for role in roles):
        raise MalformedDecisionError(f"{rule}.approver_roles must be a list of role names, got {roles!r}")
    ttl = _expect(rule, value, "preview_ttl_seconds", int, "a whole number of seconds")
    if ttl is not None and not 0 < ttl <= MAX_PREVIEW_TTL_SECONDS:
        raise MalformedDecisionError(f"{rule}.preview_ttl_seconds must be 1-{MAX_PREVIEW_TTL_SECONDS}, got {ttl}")
    retry = _expect(rule, value, "retry_after_seconds", int, "a whole number of seconds")
    if retry is not None and (code != ErrorCode.RATE_LIMITED.value or not 0 < retry <= MAX_RETRY_AFTER_SECONDS):
        raise MalformedDecisionError(f"{rule}.retry_after_seconds must be 1-{MAX_RETRY_AFTER_SECONDS} and come with "
                                     f"code RATE_LIMITED, got {retry} with code {code!r}")
    cacheable = _expect(rule, value, "cacheable", bool, "a boolean")
    return Decision(**{flag: value[flag]}, code=None if code is None else ErrorCode(code),
                    reason=_expect(rule, value, "reason", str, "a string") or "",
                    internal_reason=_expect(rule, value, "internal_reason", str, "a string") or "",
                    approver_roles=tuple(roles), preview_ttl_seconds=ttl, retry_after_seconds=retry,
                    cacheable=cacheable is not False)


def _expect(rule: str, document: dict[str, Any], key: str, kind: type, described: str, *,
            required: bool = False) -> Any:
    """``document[key]`` if it has type ``kind`` (``None`` when absent and optional)."""
    value = document.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedDecisionError(f"{rule}.{key} must be {described}, got {value!r}")
    return value


def parse_audit_masks(value: Any) -> dict[str, tuple[str, ...]]:
    """``data.toolbooth.audit.mask`` checked: tool name -> JSON pointers (undefined: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(pointers, list) and all(isinstance(p, str) and (p == "" or p.startswith("/")) for p in pointers)
            for pointers in value.values()):
        raise MalformedDecisionError(f"{AUDIT_MASK_RULE} must map tool names to lists of JSON pointers "
                                     "(\"\" or starting with /)")
    return {tool: tuple(pointers) for tool, pointers in value.items()}
