"""Only a well-typed decision document counts; everything else is a malformed decision."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.contract import ErrorCode
from sidecar.errors import MalformedDecisionError, PolicyEvaluationError
from sidecar.policy import Decision, Stage, parse_decision


def test_full_documents_are_read() -> None:
    authz = parse_decision(Stage.AUTHZ, {"allow": False, "code": "RESOURCE_NOT_FOUND", "reason": "no such file",
                                         "internal_reason": "tenant mismatch acme/globex"})
    assert authz == Decision(allow=False, code=ErrorCode.RESOURCE_NOT_FOUND, reason="no such file",
                             internal_reason="tenant mismatch acme/globex")
    approval = parse_decision(Stage.APPROVAL, {"required": True, "approver_roles": ["approver", "lead"],
                                               "preview_ttl_seconds": 600})
    assert approval.required and approval.approver_roles == ("approver", "lead")
    assert approval.preview_ttl_seconds == 600
    assert approval.document() == {"required": True, "approver_roles": ["approver", "lead"],
                                   "preview_ttl_seconds": 600}


def test_unknown_keys_are_ignored() -> None:
    assert parse_decision(Stage.AVAILABILITY, {"allow": True, "note": "x"}) == Decision(allow=True)


@pytest.mark.parametrize(("stage", "value", "message"), [
    (Stage.AUTHZ, None, "undefined or null"),
    (Stage.AUTHZ, True, "a bool, not an object"),
    (Stage.AUTHZ, [{"allow": True}], "a list, not an object"),
    (Stage.AUTHZ, {}, "allow must be a boolean, got None"),
    (Stage.AUTHZ, {"allow": "true"}, "allow must be a boolean"),
    (Stage.AUTHZ, {"allow": 1}, "allow must be a boolean"),
    (Stage.APPROVAL, {"allow": True}, "required must be a boolean"),
    (Stage.AUTHZ, {"allow": False, "code": "FORBIDDEN"}, "code must be one of"),
    (Stage.AUTHZ, {"allow": False, "code": 403}, "code must be one of"),
    (Stage.AUTHZ, {"allow": True, "code": "PERMISSION_DENIED"}, "conflicts"),
    (Stage.AUTHZ, {"allow": False, "reason": ["x"]}, "reason must be a string"),
    (Stage.AUTHZ, {"allow": False, "internal_reason": 5}, "internal_reason must be a string"),
    (Stage.APPROVAL, {"required": True, "approver_roles": "approver"}, "approver_roles must be a list"),
    (Stage.APPROVAL, {"required": True, "approver_roles": ["", "x"]}, "approver_roles must be a list"),
    (Stage.APPROVAL, {"required": True, "preview_ttl_seconds": 0}, "preview_ttl_seconds must be 1-"),
    (Stage.APPROVAL, {"required": True, "preview_ttl_seconds": 10**9}, "preview_ttl_seconds must be 1-"),
    (Stage.APPROVAL, {"required": True, "preview_ttl_seconds": 1.5}, "whole number"),
    (Stage.APPROVAL, {"required": True, "preview_ttl_seconds": True}, "whole number"),
])
def test_malformed_documents_name_the_rule(stage: Stage, value: Any, message: str) -> None:
    with pytest.raises(MalformedDecisionError) as caught:
        parse_decision(stage, value)
    assert str(caught.value).startswith(f"data.toolbooth.{stage.value}.decision")
    assert message in str(caught.value)
    assert isinstance(caught.value, PolicyEvaluationError)
