"""Each pipeline stage on its own, through ``Pipeline.execute`` with the default policies."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import assemble
from sidecar.canonical import canonical_bytes, sha256_hex
from sidecar.config import Limits, bundled_policy_dir
from sidecar.contract import CallRequest, ErrorCode, Recovery, Status, ToolResult
from sidecar.errors import MalformedDecisionError, PolicyEvaluationError, StoreUnavailableError
from sidecar.pipeline import Pipeline
from sidecar.pipeline.call import Arguments, Call
from sidecar.policy import CALL_STAGES, Decision, DelegatingEngine, PolicyEngine, Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import CallInput, PolicyInput
from sidecar.state import DEADLINE_GRACE_SECONDS, KeyScope
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.conftest import ADMIN, DEVELOPER, PipelineFactory
from tests.support import tools
from tests.support.clock import MovedClock
from tests.support.history import with_meters
from tests.support.waiting import until


async def call(pipeline: Pipeline, tool: str, args: Any = None, **fields: Any) -> ToolResult:
    arguments = args if isinstance(args, str) else json.dumps(args or {})
    return await pipeline.execute(fields.pop("principal", DEVELOPER), CallRequest(tool=tool, arguments_json=arguments,
                                                                                  **fields))


class FailingEngine(DelegatingEngine):
    """A policy engine whose chosen stage fails with ``error``."""

    def __init__(self, inner: PolicyEngine, failing: Stage, error: Exception | None = None) -> None:
        super().__init__(inner)
        self.failing = failing
        self.error = error or PolicyEvaluationError("division by zero in authz.rego:12")

    @property
    def revision(self) -> str:
        return "sha256:failing"

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        if stage is self.failing:
            raise self.error
        return await self.inner.decide(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        return [await self.decide(stage, i) for i in inputs]


async def test_success_carries_data_and_meta(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    result = await call(pipeline, "echo", {"text": "hi"})
    assert result.status is Status.SUCCESS
    assert result.data == {"text": "hi", "principal": "dev-1", "attempt": 1}
    assert result.error is None and result.errors == ()
    assert result.meta.tool == "echo" and result.meta.tool_version == "1.0.0" and result.meta.attempt == 1
    assert result.meta.policy_revision == pipeline.policy.revision and len(result.meta.request_id) == 32


async def test_sync_handler_runs_in_pool(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "echo_sync", {"text": "a"})
    assert result.status is Status.SUCCESS and result.data["text"] == "a"


# --- resolve + availability -------------------------------------------------------------------

async def test_unknown_and_hidden_tools_look_the_same(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    unknown = await call(pipeline, "no_such_tool", {"text": "x"})
    hidden = await call(pipeline, "admin_console", {"text": "x"})
    for result, name in ((unknown, "no_such_tool"), (hidden, "admin_console")):
        assert result.status is Status.ERROR and result.error is not None
        assert result.error.code is ErrorCode.TOOL_UNAVAILABLE and result.error.recovery is Recovery.DO_NOT_RETRY
        assert result.error.message == f"tool {name!r} is not available"
    assert (await call(pipeline, "admin_console", {"text": "x"}, principal=ADMIN)).status is Status.SUCCESS


async def test_list_tools_is_filtered_by_availability(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    developer = {t.name for t in (await pipeline.list_tools(DEVELOPER)).tools}
    admin = {t.name for t in (await pipeline.list_tools(ADMIN)).tools}
    assert "admin_console" not in developer and "admin_console" in admin
    assert admin - developer == {"admin_console"}
    listing = await pipeline.list_tools(DEVELOPER)
    note = next(t for t in listing.tools if t.name == "create_note")
    assert note.requires_idempotency_key and note.timeout_ms == 2000
    assert note.input_schema["properties"]["text"]["type"] == "string"
    assert listing.policy_revision == pipeline.policy.revision


# --- validation -------------------------------------------------------------------------------

@pytest.mark.parametrize(("arguments", "field", "fragment"), [
    ("{not json", None, "not valid JSON"),
    ("[1, 2]", None, "must be a JSON object, got an array"),
    ('{"text": 5}', "text", "valid string"),
    ('{"text": "a", "extra": 1}', "extra", "Extra inputs"),
    ("{}", "text", "Field required"),
])
async def test_invalid_arguments(make_pipeline: PipelineFactory, arguments: str, field: str | None,
                                 fragment: str) -> None:
    result = await call(await make_pipeline(), "echo", arguments)
    assert result.status is Status.ERROR and result.error is not None
    assert result.error.code is ErrorCode.INVALID_ARGUMENT and result.error.recovery is Recovery.CORRECT_ARGUMENTS
    assert result.error.field == field and fragment in result.error.message
    assert result.meta.attempt == 0


async def test_every_invalid_field_is_reported(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "echo", {"text": 1, "a": 2, "b": 3})
    assert [e.field for e in result.errors] == ["text", "a", "b"]
    assert result.error == result.errors[0]


async def test_size_and_depth_limits(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(max_argument_bytes=100, max_argument_depth=4)
    too_big = await call(pipeline, "nested", {"payload": {"x": "y" * 200}})
    assert too_big.error is not None and "limit is 100" in too_big.error.message
    deep: dict[str, Any] = {}
    for _ in range(5):
        deep = {"k": deep}
    too_deep = await call(pipeline, "nested", {"payload": deep})
    assert too_deep.error is not None and "nested deeper than 4" in too_deep.error.message
    assert (await call(pipeline, "nested", {"payload": {"k": {"k": 1}}})).status is Status.SUCCESS


async def test_pathological_nesting_is_rejected_not_crashed(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(max_argument_bytes=1_000_000), "nested", "[" * 200_000)
    assert result.error is not None and result.error.code is ErrorCode.INVALID_ARGUMENT


# --- authorization and approval ---------------------------------------------------------------

async def test_missing_permission_is_denied_with_reason(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "delete_records", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.PERMISSION_DENIED
    assert result.error.recovery is Recovery.REQUEST_PERMISSION and "records:delete" in result.error.message


async def test_approval_required_does_not_run_handler(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "send_email", {"text": "x"}, idempotency_key="k1")
    assert result.status is Status.APPROVAL_REQUIRED and result.error is not None
    assert result.error.code is ErrorCode.APPROVAL_REQUIRED and result.error.recovery is Recovery.REQUEST_USER_INPUT
    assert result.preview is not None and result.preview.reason == result.error.message


@pytest.mark.parametrize("stage", CALL_STAGES)
async def test_policy_failure_fails_closed(make_pipeline: PipelineFactory, default_engine: Any, stage: Stage) -> None:
    before = tools.CREATED.value
    pipeline = await make_pipeline(policy=FailingEngine(default_engine, stage))
    result = await call(pipeline, "create_note", {"text": "x"}, idempotency_key=f"fail-{stage}")
    assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE
    assert result.error.retryable and result.error.recovery is Recovery.RETRY_WITH_BACKOFF
    assert "division" not in result.error.message and tools.CREATED.value == before


@pytest.mark.parametrize("stage", CALL_STAGES)
async def test_malformed_decision_is_an_internal_error(make_pipeline: PipelineFactory, default_engine: Any,
                                                      stage: Stage) -> None:
    before = tools.CREATED.value
    error = MalformedDecisionError(f"data.toolbooth.{stage}.decision.allow must be a boolean, got 'yes'")
    pipeline = await make_pipeline(policy=FailingEngine(default_engine, stage, error))
    result = await call(pipeline, "create_note", {"text": "x"}, idempotency_key=f"malformed-{stage}")
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert not result.error.retryable and result.error.recovery is Recovery.DO_NOT_RETRY
    assert "yes" not in result.error.message and tools.CREATED.value == before


async def test_internal_reason_reaches_only_the_audit(make_pipeline: PipelineFactory, tmp_path: Any) -> None:
    root = tmp_path / "policies"
    shutil.copytree(bundled_policy_dir(), root)
    (root / "authz.rego").write_text(
        "package toolbooth.authz\n\nimport rego.v1\n\n"
        'decision := {"allow": false, "code": "RESOURCE_NOT_FOUND", "reason": "no such record",\n'
        '             "internal_reason": "record belongs to tenant globex"}\n')
    pipeline = await make_pipeline(policy=EmbeddedEngine.load(root))
    result = await call(pipeline, "echo", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.RESOURCE_NOT_FOUND
    assert result.error.message == "no such record" and "globex" not in result.model_dump_json()
    [event] = await pipeline.store.audit_events()  # type: ignore[attr-defined]
    assert json.loads(event.decisions_json)["authz"]["internal_reason"] == "record belongs to tenant globex"


async def test_list_tools_fails_closed(make_pipeline: PipelineFactory, default_engine: Any) -> None:
    pipeline = await make_pipeline(policy=FailingEngine(default_engine, Stage.AVAILABILITY))
    with pytest.raises(PolicyEvaluationError):
        await pipeline.list_tools(DEVELOPER)


# --- idempotency ------------------------------------------------------------------------------

async def test_write_tool_requires_key(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "create_note", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.INVALID_ARGUMENT
    assert result.error.field == "idempotency_key"
    assert result.error.message == "tool 'create_note' has side effects: an idempotency_key is required"


async def test_replay_and_reuse(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    first = await call(pipeline, "create_note", {"text": "x"}, idempotency_key="k")
    again = await call(pipeline, "create_note", {"text": "x"}, idempotency_key="k")
    assert first.status is Status.SUCCESS and again.data == first.data
    assert again.meta.idempotency_replayed and not first.meta.idempotency_replayed
    assert again.meta.request_id != first.meta.request_id
    other = await call(pipeline, "create_note", {"text": "y"}, idempotency_key="k")
    assert other.error is not None and other.error.code is ErrorCode.IDEMPOTENCY_KEY_REUSED
    someone_else = await call(pipeline, "create_note", {"text": "y"}, idempotency_key="k", principal=ADMIN)
    assert someone_else.status is Status.SUCCESS and not someone_else.meta.idempotency_replayed


async def test_concurrent_duplicates_execute_once(make_pipeline: PipelineFactory, tmp_path: Path) -> None:
    # without the default limit of writes per minute, which 32 requests at once would pass
    pipeline = await make_pipeline(policy=EmbeddedEngine.load(with_meters(tmp_path / "unmetered")))
    before = tools.CREATED.value
    results = await asyncio.gather(*(call(pipeline, "create_note", {"text": "dup"}, idempotency_key="same")
                                     for _ in range(32)))
    assert tools.CREATED.value == before + 1
    codes = {r.error.code if r.error else r.status for r in results}
    assert codes <= {Status.SUCCESS, ErrorCode.OPERATION_IN_PROGRESS}
    assert sum(r.status is Status.SUCCESS and not r.meta.idempotency_replayed for r in results) == 1


async def test_a_key_whose_sidecar_died_is_unknown_and_never_runs_again(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    assert (await call(pipeline, "create_note", {"text": "x"}, idempotency_key="k")).status is Status.SUCCESS
    request_hash = (await pipeline.store.audit_events())[-1].input_hash
    lapsed = time.time() - DEADLINE_GRACE_SECONDS - 1  # claimed by a sidecar that died during the handler
    await pipeline.store.claim(KeyScope(DEVELOPER.tenant, DEVELOPER.id, "create_note", "lost"), request_hash, "dead",
                               deadline_at=lapsed)
    before = tools.CREATED.value
    unknown = await call(pipeline, "create_note", {"text": "x"}, idempotency_key="lost")
    assert unknown.error is not None and unknown.error.code is ErrorCode.OPERATION_IN_PROGRESS
    assert unknown.error.recovery is Recovery.CHECK_OPERATION_STATUS and "unknown" in unknown.error.message
    assert tools.CREATED.value == before


async def test_a_keyed_call_records_its_deadline(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    before = time.time()
    await call(pipeline, "create_note", {"text": "x"}, idempotency_key="k")
    record = await pipeline.store.operation(KeyScope(DEVELOPER.tenant, DEVELOPER.id, "create_note", "k"))
    assert record is not None and record.deadline_at is not None
    assert before + 1.9 < record.deadline_at <= time.time() + 2  # create_note's timeout is 2 s
    request = CallRequest(tool="create_note", arguments_json='{"text": "x"}', idempotency_key="soon")
    before = time.time()
    await pipeline.execute(DEVELOPER, request, caller_deadline=time.monotonic() + 0.5)
    record = await pipeline.store.operation(KeyScope(DEVELOPER.tenant, DEVELOPER.id, "create_note", "soon"))
    assert record is not None and record.deadline_at is not None
    assert before + 1.9 < record.deadline_at  # not the caller's earlier deadline: a started write runs on past it


async def test_finished_records_past_the_retention_are_deleted(tmp_path: Path, default_engine: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sidecar.state.expiry.EXPIRY_INTERVAL_SECONDS", 0.0)
    store, clock = await SqliteStore.open(tmp_path / "store.db"), MovedClock()
    pipeline = assemble(registry=Registry.from_tools(tools.ALL), policy=default_engine, store=store, limits=Limits(),
                        retention_hours=1, clock=clock)
    try:
        await call(pipeline, "create_note", {"text": "x"}, idempotency_key="old")
        clock.advance(3600)  # the retention: what finished before the cleanup started is past it
        await call(pipeline, "create_note", {"text": "x"}, idempotency_key="new")  # starts the cleanup
        old, new = (KeyScope(DEVELOPER.tenant, DEVELOPER.id, "create_note", k) for k in ("old", "new"))
        async def deleted() -> bool:
            return await store.operation(old) is None

        await until(deleted, timeout=5, what="the old record's deletion")
        assert await store.operation(new) is not None
    finally:
        await pipeline.aclose()


# --- dispatch and results ---------------------------------------------------------------------

async def test_handler_exception_is_generic(make_pipeline: PipelineFactory, caplog: pytest.LogCaptureFixture) -> None:
    result = await call(await make_pipeline(), "boom", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert "hunter2" not in result.model_dump_json() and "hunter2" in caplog.text


async def test_tool_error_is_published(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "not_found", {"text": "q3"})
    assert result.error is not None and result.error.code is ErrorCode.RESOURCE_NOT_FOUND
    assert result.error.message == "no document named 'q3'" and result.error.field == "text"


async def test_tool_timeout(make_pipeline: PipelineFactory) -> None:
    started = time.monotonic()
    result = await call(await make_pipeline(), "slow", {"count": 5000})
    assert time.monotonic() - started < 1
    assert result.error is not None and result.error.code is ErrorCode.TIMEOUT
    assert result.error.retryable and result.error.recovery is Recovery.RETRY_SAME_REQUEST


async def test_caller_deadline_wins_when_shorter(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    started = time.monotonic()
    result = await pipeline.execute(DEVELOPER, CallRequest(tool="slow", arguments_json='{"count": 150}'),
                                    caller_deadline=time.monotonic() + 0.03)
    assert result.error is not None and result.error.code is ErrorCode.TIMEOUT
    assert time.monotonic() - started < 0.12


async def test_read_tool_retries_retryable_errors(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    before = tools.FLAKY.value
    result = await call(pipeline, "flaky", {"count": 3})
    assert result.status is Status.SUCCESS and result.meta.attempt == 3 and tools.FLAKY.value == before + 3
    gave_up = await call(pipeline, "flaky", {"count": 9})
    assert gave_up.error is not None and gave_up.error.code is ErrorCode.SERVICE_UNAVAILABLE
    assert gave_up.meta.attempt == 3


async def test_result_above_limit_is_an_error(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(max_result_bytes=1000)
    result = await call(pipeline, "big", {"count": 5000})
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert "above the limit of 1000" in result.error.message and result.data is None
    assert not result.meta.truncated


# --- audit ------------------------------------------------------------------------------------

async def test_every_call_is_audited_with_decisions(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    ok = await call(pipeline, "echo", {"text": "secret words"}, call_id="m-1", conversation_id="c-1")
    denied = await call(pipeline, "delete_records", {"text": "x"})
    events = {e.request_id: e for e in await pipeline.store.audit_events()}  # type: ignore[attr-defined]
    event = events[ok.meta.request_id]
    assert (event.principal_id, event.tool, event.status, event.call_id) == ("dev-1", "echo", "success", "m-1")
    assert "secret words" not in event.input_hash and event.input_hash.startswith("sha256:")
    assert set(json.loads(event.decisions_json)) == {"availability", "history", "history_read", "authz", "approval"}
    assert json.loads(event.decisions_json)["history_read"] == {"approval": ["conversation"]}  # no meter, no failure
    assert event.policy_revision == pipeline.policy.revision
    assert events[denied.meta.request_id].error_code == "PERMISSION_DENIED"


async def test_write_tool_is_audited_before_dispatch(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, tools.held_note]))
    tools.HOLD.close()
    started = tools.HELD_STARTED.value
    task = asyncio.create_task(call(pipeline, "held_note", {"text": "x"}, idempotency_key="audit-first"))
    await tools.HELD_STARTED.reached(started + 1)  # the handler runs, held
    during = await pipeline.store.audit_events()  # type: ignore[attr-defined]
    assert [e.status for e in during] == ["dispatching"]
    tools.HOLD.open()
    result = await task
    after = await pipeline.store.audit_events()  # type: ignore[attr-defined]
    assert [(e.request_id, e.status) for e in after] == [(result.meta.request_id, "dispatching"),
                                                         (result.meta.request_id, "success")]


async def test_deadline_cancels_async_handler(make_pipeline: PipelineFactory) -> None:
    before = tools.SLOW_CANCELLED.value
    result = await call(await make_pipeline(), "slow", {"count": 5000})
    assert result.error is not None and result.error.code is ErrorCode.TIMEOUT
    assert tools.SLOW_CANCELLED.value == before + 1


async def test_caller_cancellation_reaches_read_handler(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    before, started = tools.SLOW_CANCELLED.value, tools.SLOW_STARTED.value
    task = asyncio.create_task(call(pipeline, "slow", {"count": 150}))
    await tools.SLOW_STARTED.reached(started + 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tools.SLOW_CANCELLED.value == before + 1
    statuses = [e.status for e in await pipeline.store.audit_events()]  # type: ignore[attr-defined]
    assert statuses == ["cancelled"]


async def test_started_write_finishes_when_caller_goes_away(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(registry=Registry.from_tools([*tools.ALL, tools.held_note]))
    tools.HOLD.close()
    started, done = tools.HELD_STARTED.value, tools.HELD_DONE.value
    task = asyncio.create_task(call(pipeline, "held_note", {"text": "x"}, idempotency_key="gone"))
    await tools.HELD_STARTED.reached(started + 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    tools.HOLD.open()  # the write goes on without its caller, and is recorded
    await settled(pipeline, "held_note", "gone")
    replay = await call(pipeline, "held_note", {"text": "x"}, idempotency_key="gone")
    assert replay.meta.idempotency_replayed and replay.data == {"count": done + 1}
    assert tools.HELD_STARTED.value == started + 1
    statuses = [e.status for e in await pipeline.store.audit_events()]  # type: ignore[attr-defined]
    assert statuses == ["dispatching", "success", "success"]  # the write, then its replay


class RecordingEngine(DelegatingEngine):
    """Passes decisions through and keeps every input it was asked about."""

    def __init__(self, inner: PolicyEngine) -> None:
        super().__init__(inner)
        self.seen: list[tuple[Stage, Any]] = []

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.seen.append((stage, input.document()))
        return await self.inner.decide(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        return [await self.decide(stage, i) for i in inputs]


async def test_policy_input_has_the_documented_shape(make_pipeline: PipelineFactory, default_engine: Any) -> None:
    engine = RecordingEngine(default_engine)
    pipeline = await make_pipeline(policy=engine)
    await call(pipeline, "create_note", {"text": "hi"}, idempotency_key="k-1", conversation_id="c-9")
    assert [stage for stage, _ in engine.seen] == [Stage.AVAILABILITY, Stage.AUTHZ, Stage.APPROVAL]
    availability, authz, approval = (document for _, document in engine.seen)
    assert availability["principal"] == {"id": "dev-1", "tenant": "acme", "roles": ["developer"], "permissions": []}
    assert availability["tool"] == {"name": "create_note", "version": "1.0.0", "side_effect": "internal_reversible",
                                    "permissions": [], "plugin": "tests.support.tools"}
    assert "call" not in availability
    assert authz["call"] == {"arguments": {"text": "hi"}, "conversation_id": "c-9", "idempotency_key": "k-1"}
    for stage, document in engine.seen:
        assert document["context"]["stage"] == stage.value and document["context"]["conversation_id"] == "c-9"
        assert document["context"]["time"].endswith("Z")
    assert approval["call"] == authz["call"]


async def test_an_unknown_approval_id_runs_nothing(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "echo", {"text": "x"}, approval_id="p-1")
    assert result.error is not None and result.error.code is ErrorCode.RESOURCE_NOT_FOUND
    assert result.error.field == "approval_id" and result.meta.attempt == 0


async def test_a_handlers_own_timeout_error_is_not_the_deadline(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "own_timeout", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert result.error.message == "the tool failed unexpectedly" and result.meta.attempt == 1


async def settled(pipeline: Pipeline, tool: str, key: str, *, timeout: float = 5.0) -> None:
    """Wait until the call holding ``key`` has stored its result."""
    scope = KeyScope(DEVELOPER.tenant, DEVELOPER.id, tool, key)

    async def stored() -> bool:
        record = await pipeline.store.operation(scope)
        return record is not None and record.result_json is not None

    await until(stored, timeout=timeout, what=f"the result of {key}")


class SlowClaims:
    """A store whose claims wait until the test opens ``gate``, as with a busy database."""

    def __init__(self, inner: Any, gate: tools.Gate) -> None:
        self.inner, self.gate, self.claiming = inner, gate, tools.Counter()

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claiming.bump()
        await self.gate.passed()
        return await self.inner.claim(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_caller_gone_during_the_claim_leaves_no_stuck_key(make_pipeline: PipelineFactory) -> None:
    gate = tools.Gate()
    pipeline = await make_pipeline(wrap_store=lambda store: SlowClaims(store, gate))
    slow_store: SlowClaims = pipeline.store  # type: ignore[assignment]
    before = tools.CREATED.value
    task = asyncio.create_task(call(pipeline, "create_note", {"text": "x"}, idempotency_key="early-exit"))
    await slow_store.claiming.reached(1)  # still claiming
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.open()  # the claim and the write go on without the caller
    await settled(pipeline, "create_note", "early-exit")
    retry = await call(pipeline, "create_note", {"text": "x"}, idempotency_key="early-exit")
    assert retry.status is Status.SUCCESS and retry.meta.idempotency_replayed
    assert tools.CREATED.value == before + 1


async def test_closing_waits_for_started_writes(default_engine: Any, tmp_path: Path) -> None:
    async def pipeline() -> Pipeline:
        store = await SqliteStore.open(tmp_path / "shutdown.db")
        return assemble(registry=Registry.from_tools(tools.ALL), policy=default_engine, store=store, limits=Limits())

    first, before = await pipeline(), tools.CREATED.value
    task = asyncio.create_task(call(first, "create_note", {"text": "x"}, idempotency_key="at-shutdown"))
    await tools.CREATED.reached(before + 1)  # the handler runs (for 50 ms)
    await first.aclose()
    assert (await task).status is Status.SUCCESS and tools.CREATED.value == before + 1
    reopened = await pipeline()
    try:
        replay = await call(reopened, "create_note", {"text": "x"}, idempotency_key="at-shutdown")
        assert replay.meta.idempotency_replayed
        statuses = [e.status for e in await reopened.store.audit_events()]  # type: ignore[attr-defined]
        assert statuses == ["dispatching", "success", "success"]
    finally:
        await reopened.aclose()


async def test_unknown_and_hidden_tools_fail_alike_when_the_engine_fails(make_pipeline: PipelineFactory,
                                                                        default_engine: Any) -> None:
    pipeline = await make_pipeline(policy=FailingEngine(default_engine, Stage.AVAILABILITY))
    hidden = await call(pipeline, "admin_console", {"text": "x"})
    unknown = await call(pipeline, "admin_consol", {"text": "x"})
    assert hidden.error is not None and unknown.error is not None
    assert hidden.error.code is unknown.error.code is ErrorCode.SERVICE_UNAVAILABLE
    garbage = await call(pipeline, "Not A Tool!" * 1000, {})
    assert garbage.error is not None and garbage.error.code is ErrorCode.TOOL_UNAVAILABLE


class BrokenStore:
    """A store whose chosen operation fails as a full disk or a dead database would (until ``failing`` is
    set to ``None``)."""

    def __init__(self, inner: Any, failing: str | None) -> None:
        self.inner, self.failing = inner, failing

    def __getattr__(self, name: str) -> Any:
        if name == self.failing:
            async def fail(*args: Any, **kwargs: Any) -> Any:
                raise StoreUnavailableError("disk I/O error")
            return fail
        return getattr(self.inner, name)


@pytest.mark.parametrize(("failing", "message"), [
    ("claim", "state store unavailable; nothing was executed"),
    ("record_audit", "the audit log is unavailable; nothing was executed"),
])
async def test_a_store_that_cannot_write_runs_nothing(make_pipeline: PipelineFactory, failing: str,
                                                      message: str) -> None:
    pipeline = await make_pipeline(wrap_store=lambda store: BrokenStore(store, failing))
    before = tools.CREATED.value
    result = await call(pipeline, "create_note", {"text": "x"}, idempotency_key=f"broken-{failing}")
    assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE
    assert result.error.retryable and result.error.message == message and tools.CREATED.value == before
    pipeline.store.failing = None  # type: ignore[attr-defined]  # the key was not left claimed: a retry runs
    retry = await call(pipeline, "create_note", {"text": "x"}, idempotency_key=f"broken-{failing}")
    assert retry.status is Status.SUCCESS and not retry.meta.idempotency_replayed


async def test_get_operation_on_a_broken_store_is_unavailable(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(wrap_store=lambda store: BrokenStore(store, "operation"))
    with pytest.raises(StoreUnavailableError):
        await pipeline.get_operation(DEVELOPER, tool="create_note", key="k")


async def test_an_overlong_idempotency_key_is_refused(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "create_note", {"text": "x"}, idempotency_key="k" * 257)
    assert result.error is not None and result.error.code is ErrorCode.INVALID_ARGUMENT
    assert result.error.field == "idempotency_key" and "1-256 characters" in result.error.message
    assert result.error.message == ("idempotency_key is 257 bytes: it must be 1-256 characters and at most 256 bytes "
                                    "of UTF-8, without control characters")


async def test_an_output_that_does_not_fit_its_model_is_internal(make_pipeline: PipelineFactory) -> None:
    result = await call(await make_pipeline(), "bad_output", {"text": "x"})
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL_ERROR
    assert result.error.message == "the tool returned an invalid result"


async def test_a_deadline_already_passed_runs_nothing(make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    result = await pipeline.execute(DEVELOPER, CallRequest(tool="slow", arguments_json='{"count": 1}'),
                                    caller_deadline=time.monotonic() - 1)
    assert result.error is not None and result.error.code is ErrorCode.TIMEOUT
    assert result.error.message == "the call's deadline passed before the tool ran"



async def test_a_write_whose_callers_deadline_passed_before_it_started_runs_nothing(
        make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline()
    before = tools.CREATED.value
    request = CallRequest(tool="create_note", arguments_json='{"text": "x"}', idempotency_key="too-late")
    result = await pipeline.execute(DEVELOPER, request, caller_deadline=time.monotonic() - 1)
    assert result.error is not None and result.error.code is ErrorCode.TIMEOUT and result.meta.attempt == 0
    assert result.error.message == "the call's deadline passed before the tool ran" and result.error.retryable
    assert tools.CREATED.value == before  # its own deadline (the tool's timeout) is ahead, but it never started
    assert await pipeline.store.operation(KeyScope(DEVELOPER.tenant, DEVELOPER.id, "create_note", "too-late")) is None


@pytest.mark.parametrize("data", [{}, {"text": "hi", "n": 2}, {"x": 1e-07, "y": 2.0, "z": [1.5, None, True]},
                                  {"ü": "é", "a\u2028": {"b": "\u0007"}, "😀": 1}])
def test_the_request_hash_is_the_canonical_hash_of_tool_version_and_arguments(data: dict[str, Any]) -> None:
    defn = tools.ALL[0]
    call = Call(DEVELOPER, CallRequest(tool=defn.name, arguments_json=json.dumps(data)), "sha256:rev")
    call.tool = defn
    call.arguments = Arguments(defn.input_model.model_construct(), data, frozenset(),
                               CallInput.of(data, call.request), canonical_bytes(data))
    assert call.request_hash == sha256_hex({"tool": defn.name, "version": defn.version, "arguments": data})
