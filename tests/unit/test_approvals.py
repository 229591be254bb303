"""The canonical call an approval is bound to, its hash, and failing closed when the store or the
approver policy fails."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.canonical import canonical_json, sorted_json
from sidecar.config import Limits
from sidecar.contract import ErrorCode, PreviewState, Principal
from sidecar.errors import MalformedDecisionError, PolicyEvaluationError, StoreUnavailableError
from sidecar.pipeline.approvals import READ_BATCH, Approvals, CallToApprove, Refusal, preview_hash
from sidecar.policy import Decision, Stage
from sidecar.policy.input import PolicyInput
from sidecar.state import PreviewQuery, PreviewRecord
from sidecar.state.sqlite import SqliteStore

ALICE = Principal(id="alice", tenant="acme", roles=("developer",))
MAX_PENDING = Limits().max_pending_previews_per_principal
CALL = CallToApprove(ALICE, "file_note", "1.0.0", {"title": "t", "body": "b"}, "sha256:rev-1")


def test_canonical_call_names_everything_the_approval_binds() -> None:
    assert CALL.canonical() == {"tool": "file_note", "version": "1.0.0", "arguments": {"title": "t", "body": "b"},
                                "principal": {"id": "alice", "tenant": "acme"}, "policy_revision": "sha256:rev-1",
                                "conversation_id": None}
    assert canonical_json(CALL.canonical()) == ('{"arguments":{"body":"b","title":"t"},"conversation_id":null,'
                                                '"policy_revision":"sha256:rev-1","principal":{"id":"alice",'
                                                '"tenant":"acme"},"tool":"file_note","version":"1.0.0"}')
    # the form of previews stored before approvals were bound to a conversation
    assert canonical_json(CALL.canonical(bound=False)) == ('{"arguments":{"body":"b","title":"t"},"policy_revision":'
                                                           '"sha256:rev-1","principal":{"id":"alice",'
                                                           '"tenant":"acme"},"tool":"file_note","version":"1.0.0"}')


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
    replace(CALL, conversation_id="conv-b"),
], ids=["tool", "version", "argument", "extra-argument", "principal", "tenant", "revision", "conversation"])
def test_every_part_of_the_call_changes_the_hash(changed: CallToApprove) -> None:
    assert preview_hash(changed.canonical()) != preview_hash(CALL.canonical())


def test_an_older_revision_can_be_put_back_for_comparison() -> None:
    later = replace(CALL, policy_revision="sha256:rev-2")
    assert preview_hash(later.canonical("sha256:rev-1")) == preview_hash(CALL.canonical())


class BrokenStore:
    """Every preview read and move fails, as a store that is down does."""

    def __init__(self) -> None:
        self.events: list[object] = []

    async def get_preview(self, preview_id: str) -> None:
        raise StoreUnavailableError("disk I/O error at /secret/path")

    async def consume_approval(self, preview_id: str, *, now: float, key: str | None = None) -> bool:
        raise StoreUnavailableError("disk I/O error at /secret/path")

    async def restore_approval(self, preview_id: str) -> bool:
        raise StoreUnavailableError("disk I/O error at /secret/path")

    def queue_audit(self, event: object) -> None:
        self.events.append(event)


class FailingApprover:
    """A policy engine whose approver rule cannot be evaluated (or answers malformed)."""

    def __init__(self, error: PolicyEvaluationError) -> None:
        self.error, self.revision = error, "sha256:rev-1"

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        raise self.error


async def test_a_failing_store_refuses_redeeming_and_deciding() -> None:
    store = BrokenStore()
    approvals = Approvals(store, FailingApprover(PolicyEvaluationError("x")), max_pending=MAX_PENDING)  # type: ignore[arg-type]
    refusal = await approvals.check("p-1", CALL, Decision(required=True))
    assert isinstance(refusal, Refusal)
    assert refusal.error.code is ErrorCode.SERVICE_UNAVAILABLE and refusal.error.retryable
    assert "secret" not in refusal.error.message
    consumed = await approvals.consume("p-1", key="k-1")
    assert consumed is not None and consumed.error.code is ErrorCode.SERVICE_UNAVAILABLE
    assert "secret" not in consumed.error.message
    await approvals.restore("p-1")  # logged; the approval stays as it is (a retry is refused, never run twice)
    result = await approvals.approve(ALICE, "p-1", "sha256:00", None)
    assert not result.ok and result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE
    assert len(store.events) == 1  # the attempt is audited


@pytest.mark.parametrize(("error", "code"), [(PolicyEvaluationError("down"), ErrorCode.SERVICE_UNAVAILABLE),
                                             (MalformedDecisionError("allow: 'yes'"), ErrorCode.INTERNAL_ERROR)])
async def test_a_failing_approver_policy_approves_nothing(tmp_path: Path, error: PolicyEvaluationError,
                                                          code: ErrorCode) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    try:
        approvals = Approvals(store, FailingApprover(error), max_pending=MAX_PENDING)  # type: ignore[arg-type]
        preview = await approvals.open_preview(CALL, Decision(required=True, reason="why"))
        result = await approvals.approve(Principal(id="bob", roles=("approver",)), preview.preview_id,
                                         preview.preview_hash, None)
        assert not result.ok and result.error is not None and result.error.code is code
        stored = await store.get_preview(preview.preview_id)
        assert stored is not None and stored.state is PreviewState.PENDING
    finally:
        await store.aclose()


async def test_preview_ids_are_random_hex(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    try:
        approvals = Approvals(store, FailingApprover(PolicyEvaluationError("unused")), max_pending=MAX_PENDING)  # type: ignore[arg-type]
        ids = {(await approvals.open_preview(CALL, Decision(required=True))).preview_id for _ in range(50)}
    finally:
        await store.aclose()
    assert len(ids) == 50 and all(len(i) == 48 and int(i, 16) >= 0 for i in ids)  # hex: never an option's "-"


def _stored(call: CallToApprove, preview_hash_: str, call_json: str) -> PreviewRecord:
    """A preview ``call``'s call used with idempotency key ``k-1``, as a store keeps it."""
    return PreviewRecord(preview_id="p-1", preview_hash=preview_hash_, tenant="acme", principal_id="alice",
                         tool=call.tool, tool_version=call.version, call_json=call_json,
                         policy_revision=call.policy_revision, reason="r", approver_roles=("approver",),
                         created_at=0.0, expires_at=1.0, state=PreviewState.USED, used_at=0.5, used_key="k-1")


async def _check(tmp_path: Path, record: PreviewRecord, call: CallToApprove) -> ErrorCode | None:
    """What checking ``call`` against the stored ``record`` says, for a retry with the key that used it."""
    store = await SqliteStore.open(tmp_path / "store.db")
    try:
        await store.save_preview(record, max_pending=MAX_PENDING)
        refusal = await Approvals(store, None, max_pending=MAX_PENDING).check("p-1", call, Decision(), key="k-1")  # type: ignore[arg-type]
    finally:
        await store.aclose()
    return refusal.error.code if isinstance(refusal, Refusal) else None


async def test_a_preview_hashed_before_rfc8785_still_matches_its_call(tmp_path: Path) -> None:
    """Previews written before conversations were bound were hashed over Python's JSON: with floats in the
    arguments the bytes differ from JCS, and the call that used one must still be recognised (to replay it)."""
    call = replace(CALL, arguments={"amount": 10.0, "ratio": 1e-7})
    old = call.canonical(bound=False)
    record = _stored(call, "sha256:" + hashlib.sha256(sorted_json(old).encode()).hexdigest(), sorted_json(old))
    assert record.preview_hash != preview_hash(old)  # the two forms differ for these arguments
    assert await _check(tmp_path / "same", record, call) is None
    changed = replace(call, arguments={"amount": 11.0, "ratio": 1e-7})
    assert await _check(tmp_path / "changed", record, changed) is ErrorCode.INVALID_ARGUMENT


async def test_a_bound_preview_matches_only_its_rfc8785_hash(tmp_path: Path) -> None:
    call = replace(CALL, arguments={"amount": 10.0})
    bound = call.canonical()
    legacy = _stored(call, "sha256:" + hashlib.sha256(sorted_json(bound).encode()).hexdigest(), sorted_json(bound))
    assert await _check(tmp_path / "legacy", legacy, call) is ErrorCode.INVALID_ARGUMENT
    assert await _check(tmp_path / "jcs", _stored(call, preview_hash(bound), canonical_json(bound)), call) is None


async def test_decided_lists_ones_own_decisions_latest_first_and_all_of_them_for_operators(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    try:
        approvals = Approvals(store, FailingApprover(PolicyEvaluationError("unused")), max_pending=MAX_PENDING)  # type: ignore[arg-type]
        bob, carol = Principal(id="bob", tenant="acme"), Principal(id="carol", tenant="acme")
        other_bob = Principal(id="bob", tenant="other")
        ids = [(await approvals.open_preview(CALL, Decision(required=True))).preview_id for _ in range(4)]
        for number, (who, state) in enumerate([(bob, PreviewState.APPROVED), (carol, PreviewState.DENIED),
                                               (other_bob, PreviewState.APPROVED), (bob, PreviewState.DENIED)]):
            assert await store.decide_preview(ids[number], state, decided_by=who.model_dump_json(),
                                              comment=f"c{number}", now=1000.0 + number)
        mine = await approvals.decided(bob, all_of_them=False)
        assert [(p.preview_id, p.state, p.decided_by, p.comment) for p in mine] == [
            (ids[3], PreviewState.DENIED, "bob", "c3"), (ids[0], PreviewState.APPROVED, "bob", "c0")]
        every = await approvals.decided(bob, all_of_them=True)
        assert [p.preview_id for p in every] == ids[::-1]
        assert [p.preview_id for p in await approvals.decided(bob, all_of_them=True, limit=2)] == ids[:1:-1]
        assert await approvals.decided(Principal(id="dave", tenant="acme"), all_of_them=False) == []
    finally:
        await store.aclose()


class RareApprover:
    """An approver rule that lets the approver decide only previews of the tool ``kept``."""

    revision = "sha256:rev-1"

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        return Decision(allow=input.document()["preview"]["tool"] == "kept")


class CountingStore:
    """A store that counts the listings it is asked for."""

    def __init__(self, store: SqliteStore) -> None:
        self.store, self.listings = store, 0

    async def previews(self, query: PreviewQuery) -> list[PreviewRecord]:
        self.listings += 1
        return await self.store.previews(query)


async def test_a_page_the_approver_rule_thins_reads_the_store_in_few_round_trips(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    try:
        now = time.time()
        for number in range(1000):  # one in 50 is the approver's to decide, the newest first
            tool = "kept" if number % 50 == 0 else "other"
            await store.save_preview(replace(_stored(CALL, "sha256:x", "{}"), preview_id=f"p-{number:04}", tool=tool,
                                             state=PreviewState.PENDING, created_at=now - 1000 + number,
                                             expires_at=now + 600), max_pending=10_000)
        counting = CountingStore(store)
        approvals = Approvals(counting, RareApprover(), max_pending=MAX_PENDING)  # type: ignore[arg-type]
        page = await approvals.pending(Principal(id="bob", tenant="acme"), all_of_them=False, limit=20)
        assert [p.preview_id for p in page.previews] == [f"p-{n:04}" for n in range(950, -1, -50)]
        assert page.next_page_token == ""
        assert counting.listings <= 1000 // READ_BATCH + 1
    finally:
        await store.aclose()
