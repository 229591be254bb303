"""The canonical call an approval is bound to, and its hash."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sidecar.approvals import CallToApprove, preview_hash
from sidecar.canonical import canonical_json
from sidecar.contract import Principal

ALICE = Principal(id="alice", tenant="acme", roles=("developer",))
CALL = CallToApprove(ALICE, "file_note", "1.0.0", {"title": "t", "body": "b"}, "sha256:rev-1")


def test_canonical_call_names_everything_the_approval_binds() -> None:
    assert CALL.canonical() == {"tool": "file_note", "version": "1.0.0", "arguments": {"title": "t", "body": "b"},
                                "principal": {"id": "alice", "tenant": "acme"}, "policy_revision": "sha256:rev-1"}
    assert canonical_json(CALL.canonical()) == ('{"arguments":{"body":"b","title":"t"},"policy_revision":'
                                                '"sha256:rev-1","principal":{"id":"alice","tenant":"acme"},'
                                                '"tool":"file_note","version":"1.0.0"}')


def test_hash_ignores_key_order_and_roles() -> None:
    reordered = replace(CALL, arguments=json.loads('{"body": "b", "title": "t"}'))
    more_roles = replace(CALL, principal=ALICE.model_copy(update={"roles": ("developer", "approver")}))
    assert preview_hash(reordered.canonical()) == preview_hash(more_roles.canonical()) == preview_hash(CALL.canonical())
    assert preview_hash(CALL.canonical()).startswith("sha256:") and len(preview_hash(CALL.canonical())) == 71


@pytest.mark.parametrize("changed", [
    replace(CALL, tool="create_note"),
    replace(CALL, version="1.0.1"),
    replace(CALL, arguments={"title": "t", "body": "B"}),
    replace(CALL, arguments={"title": "t", "body": "b", "cc": None}),
    replace(CALL, principal=Principal(id="mallory", tenant="acme")),
    replace(CALL, principal=Principal(id="alice", tenant="globex")),
    replace(CALL, policy_revision="sha256:rev-2"),
], ids=["tool", "version", "argument", "extra-argument", "principal", "tenant", "revision"])
def test_every_part_of_the_call_changes_the_hash(changed: CallToApprove) -> None:
    assert preview_hash(changed.canonical()) != preview_hash(CALL.canonical())


def test_an_older_revision_can_be_put_back_for_comparison() -> None:
    later = replace(CALL, policy_revision="sha256:rev-2")
    assert preview_hash(later.canonical("sha256:rev-1")) == preview_hash(CALL.canonical())
