"""The records of a ``Call``: each set once, by the stage that owns it, and read only after that stage ran."""

from __future__ import annotations

import time

import pytest

from sidecar.contract import CallRequest
from sidecar.pipeline.approvals import Approved
from sidecar.pipeline.call import Call, Dispatched, KeyClaim
from sidecar.state import KeyScope
from tests.conftest import DEVELOPER
from tests.support import tools


def _call() -> Call:
    return Call(DEVELOPER, CallRequest(tool="create_note", arguments_json='{"text": "x"}'), "rev-1")


def test_a_record_is_none_until_its_stage_sets_it_and_setting_it_again_names_that_stage() -> None:
    call = _call()
    assert (call.tool, call.arguments, call.approved, call.claim, call.dispatched, call.trace) == (None,) * 6
    call.tool = tools.create_note
    assert call.tool is tools.create_note and call.defn is tools.create_note
    with pytest.raises(AssertionError, match=r"call\.tool is set once, by the resolve stage"):
        call.tool = tools.echo
    call.dispatched = Dispatched(1)
    with pytest.raises(AssertionError, match=r"call\.dispatched is set once, by the dispatch stage"):
        call.dispatched = Dispatched(2)
    assert call.attempts == 1


def test_the_accessors_say_which_stage_must_have_run() -> None:
    call = _call()
    with pytest.raises(AssertionError, match="the resolve stage must run first"):
        call.defn  # noqa: B018
    with pytest.raises(AssertionError, match="the validate stage must run first"):
        call.validated  # noqa: B018
    assert call.attempts == 0 and not call.detached


def test_a_claimed_write_is_detached_and_its_handler_ends_by_its_claims_deadline() -> None:
    call = _call()
    call.tool = tools.create_note
    call.caller_deadline = time.monotonic() + 0.1
    assert call.handler_deadline() <= call.caller_deadline  # a read's: the caller's deadline if earlier
    claim = KeyClaim(KeyScope(DEVELOPER.tenant, DEVELOPER.id, "create_note", "k"), time.monotonic() + 2)
    call.claim = claim
    assert call.detached and call.handler_deadline() == claim.deadline


def test_the_handler_gets_the_rendering_its_approver_approved() -> None:
    call = _call()
    call.tool = tools.create_note
    assert call.context(time.monotonic() + 1).approved_preview is None
    call.approved = Approved({"subject": "hello"})
    assert call.context(time.monotonic() + 1).approved_preview == {"subject": "hello"}
