"""Labels: a tool declares those its results may carry (``tool(labels=...)``), its handler adds them per result
(``ToolContext.add_label``), in the sidecar's process or in a worker process (``Returned.labels``), and the sidecar
records them in the call's conversation, where the next calls' policies read them (``input.conversation.labels``),
only when its policy set reads labels and only for a result that was given."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sidecar.bootstrap import assemble
from sidecar.config import IsolationSettings, Limits, bundled_policy_dir
from sidecar.contract import CallRequest, ErrorCode, Principal, SideEffect, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.policy import Decision, DelegatingEngine, PolicyEngine, Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import PolicyInput
from sidecar.state import Conversation, EventKind, HistoryEvent, history_scope
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.definition import RetryPolicy, ToolContext, ToolDefinition, ToolDefinitionError, tool
from sidecar.tools.isolation.paths import handler_path
from sidecar.tools.isolation.process import HandlerFailed, Worker
from sidecar.tools.isolation.protocol import Refused, Request, Returned
from sidecar.tools.isolation.worker import _run
from sidecar.tools.outcomes import ToolError
from sidecar.tools.registry import Registry
from tests.conftest import ADMIN, DEVELOPER, PipelineFactory
from tests.support import tools

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
ALLOWING = {
    "availability.rego": 'package toolbooth.availability\n\nimport rego.v1\n\ndefault decision := {"allow": true}\n',
    "authz.rego": 'package toolbooth.authz\n\nimport rego.v1\n\ndefault decision := {"allow": true}\n',
    "approval.rego": 'package toolbooth.approval\n\nimport rego.v1\n\ndefault decision := {"required": false}\n',
}


class Doc(BaseModel):
    """What to read: the labels the handler adds to its result, and whether it then fails."""

    text: str = "doc"
    add: list[str] = []
    fail: bool = False


class Read(BaseModel):
    text: str
    pid: int = 0  # the process the handler ran in


def handle(args: Doc, ctx: ToolContext) -> Read:
    for label in args.add:
        ctx.add_label(label)
    if args.fail:
        raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, "no such document")
    return Read(text=args.text, pid=os.getpid())


@tool(name="read_labelled", version="1.0.0", side_effect=SideEffect.NONE, labels=("restricted", "untrusted"))
async def read_labelled(args: Doc, ctx: ToolContext) -> Read:
    """Read a document, adding the labels asked for."""
    return handle(args, ctx)


@tool(name="read_labelled_sync", version="1.0.0", side_effect=SideEffect.NONE, timeout=20, labels=["restricted"])
def read_labelled_sync(args: Doc, ctx: ToolContext) -> Read:
    """``read_labelled`` as a sync handler (isolable in a worker process)."""
    return handle(args, ctx)


RETRY_ONCE = RetryPolicy(max_attempts=2, initial_backoff=0.01, retry_on={ErrorCode.SERVICE_UNAVAILABLE})


def flaky(args: Doc, ctx: ToolContext) -> Read:
    """The first attempt adds its labels and fails (retryable); the next succeeds with none."""
    if ctx.attempt == 1:
        for label in args.add:
            ctx.add_label(label)
        raise ToolError(ErrorCode.SERVICE_UNAVAILABLE, "the index is busy")
    return Read(text=args.text, pid=os.getpid())


@tool(name="read_flaky", version="1.0.0", side_effect=SideEffect.NONE, labels=("restricted",), retry=RETRY_ONCE)
async def read_flaky(args: Doc, ctx: ToolContext) -> Read:
    """``flaky``, async."""
    return flaky(args, ctx)


@tool(name="read_flaky_sync", version="1.0.0", side_effect=SideEffect.NONE, timeout=20, labels=("restricted",),
      retry=RETRY_ONCE)
def read_flaky_sync(args: Doc, ctx: ToolContext) -> Read:
    """``flaky``, sync (isolable in a worker process)."""
    return flaky(args, ctx)


REGISTRY = Registry.from_tools([read_labelled, read_labelled_sync, read_flaky, read_flaky_sync, tools.echo])


class Plain(BaseModel):
    text: str = ""


def define(labels: Any) -> ToolDefinition[Any, Any]:
    async def handler(args: Plain, ctx: ToolContext) -> Plain:
        return args

    return tool(name="labelled", version="1.0.0", side_effect=SideEffect.NONE, labels=labels)(handler)


def context(declared: Collection[str] = ()) -> ToolContext:
    logger = logging.LoggerAdapter(logging.getLogger("toolbooth.tool.test"), {})
    return ToolContext(principal=Principal(id="p"), request_id="r", deadline=time.monotonic() + 20,
                       idempotency_key=None, attempt=1, logger=logger, declared_labels=frozenset(declared))


# --- tool(labels=...) -------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [
    "restricted",  # a string is not a collection of labels (it would be its letters)
    b"restricted",
    ["Restricted"],
    ["restricted", ""],
    ["x" * 65],
    ["restricted", 3],
    ["-restricted"],
    ["restricted_"],
    ["with space"],
    [None],
])
def test_a_malformed_label_declaration_names_the_field(labels: Any) -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        define(labels)
    assert refused.value.field == "labels" and refused.value.tool == "labelled"
    assert str(refused.value).endswith(
        "tool 'labelled', field 'labels': must be a collection of names of 1-64 chars of lowercase letters, digits "
        f"and inner '_' or '-', got {labels!r}")


@pytest.mark.parametrize("labels", [None, 3, 1.5], ids=["None", "int", "float"])
def test_labels_that_are_no_collection_at_all_name_the_field(labels: Any) -> None:
    """Not a ``TypeError`` from deep inside the check: a definition error naming the plugin, tool and field."""
    with pytest.raises(ToolDefinitionError) as refused:
        define(labels)
    assert refused.value.field == "labels"


def test_a_label_with_a_trailing_newline_is_refused() -> None:
    """``$`` matches before a final newline: ``"restricted\\n"`` is not 1-64 lowercase letters, digits, '_', '-'."""
    with pytest.raises(ToolDefinitionError) as refused:
        define(["restricted\n"])
    assert refused.value.field == "labels"


def test_a_tool_name_with_a_trailing_newline_is_refused() -> None:
    async def handler(args: Plain, ctx: ToolContext) -> Plain:
        return args

    with pytest.raises(ToolDefinitionError) as refused:
        tool(name="labelled\n", version="1.0.0", side_effect=SideEffect.NONE)(handler)
    assert refused.value.field == "name"


def test_labels_given_as_a_one_shot_iterator_are_all_kept_or_refused() -> None:
    """An iterator is read once by the check: the definition must not end up declaring none of its labels."""
    try:
        defn = define(iter(["restricted", "untrusted"]))
    except ToolDefinitionError as refused:
        assert refused.field == "labels"
    else:
        assert defn.labels == frozenset({"restricted", "untrusted"})


@pytest.mark.parametrize(("labels", "expected"), [
    ((), frozenset()),
    (("restricted",), frozenset({"restricted"})),
    (["untrusted", "restricted", "untrusted"], frozenset({"restricted", "untrusted"})),
    ({"pii", "x" * 64, "a-b_c9"}, frozenset({"pii", "x" * 64, "a-b_c9"})),
])
def test_a_tool_keeps_its_labels_as_a_frozenset(labels: Collection[str], expected: frozenset[str]) -> None:
    defn = define(labels)
    assert isinstance(defn.labels, frozenset) and defn.labels == expected


def test_a_tool_without_labels_declares_none() -> None:
    assert tools.echo.labels == frozenset()
    assert read_labelled.labels == frozenset({"restricted", "untrusted"})


# --- ToolContext.add_label --------------------------------------------------------------------------------


def test_a_declared_label_is_kept() -> None:
    ctx = context({"restricted", "untrusted"})
    ctx.add_label("restricted")
    ctx.add_label("restricted")
    assert ctx.labels == {"restricted"}


def test_an_undeclared_label_is_refused_naming_it_and_how_to_declare_it() -> None:
    ctx = context({"untrusted", "restricted"})
    with pytest.raises(ValueError) as refused:
        ctx.add_label("secret")
    assert str(refused.value) == ("label 'secret' is not one the tool declares (tool(labels=...); this context holds "
                                  "restricted, untrusted: a ToolContext built by hand takes them as "
                                  "declared_labels=...)")
    assert ctx.labels == set()


def test_a_context_declaring_no_labels_refuses_every_one() -> None:
    ctx = context()
    with pytest.raises(ValueError) as refused:
        ctx.add_label("restricted")
    assert "label 'restricted' is not one the tool declares" in str(refused.value)
    assert "this context holds none" in str(refused.value)


# --- through a pipeline -----------------------------------------------------------------------------------


class RecordingEngine(DelegatingEngine):
    """Passes decisions through and keeps every authz input it was asked about."""

    def __init__(self, inner: PolicyEngine) -> None:
        super().__init__(inner)
        self.authz: list[dict[str, Any]] = []

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        if stage is Stage.AUTHZ:
            self.authz.append(input.document())
        return await self.inner.decide(stage, input)

    def last_labels(self) -> Any:
        return self.authz[-1]["conversation"]["labels"]


def request(tool: str, conversation: str | None, **arguments: Any) -> CallRequest:
    return CallRequest(tool=tool, arguments_json=json.dumps(arguments or {"text": "hi"}), conversation_id=conversation)


async def execute(pipeline: Pipeline, tool: str, conversation: str | None, *, who: Principal = DEVELOPER,
                  **arguments: Any) -> ToolResult:
    return await pipeline.execute(who, request(tool, conversation, **arguments))


def conversation_scope(who: Principal, conversation: str | None) -> str:
    return history_scope("conversation", who.tenant, who.id, conversation or "")


async def events(pipeline: Pipeline, who: Principal, conversation: str | None) -> list[HistoryEvent]:
    """The conversation's labels (and no call's failures) as the store holds them."""
    return await pipeline.store.history.conversation(Conversation(conversation_scope(who, conversation), 0.0, "", 100))


def history_rows(tmp_path: Path) -> int:
    """The rows of every store's history table under ``tmp_path``."""
    rows = 0
    for database in sorted(tmp_path.glob("store-*.db")):
        with sqlite3.connect(database) as connection:
            [(count,)] = connection.execute("SELECT count(*) FROM toolbooth_history").fetchall()
            rows += count
    return rows


@pytest.fixture
async def recording(make_pipeline: PipelineFactory) -> tuple[Pipeline, RecordingEngine]:
    engine = RecordingEngine(EmbeddedEngine.load(bundled_policy_dir()))
    return await make_pipeline(policy=engine, registry=REGISTRY), engine


def labelled(label: str, tool: str, at: str) -> dict[str, str]:
    return {"label": label, "tool": tool, "time": at}


def assert_recent(at: str, before: float, after: float) -> None:
    assert TIME.match(at), at
    seconds = dt.datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    assert before - 1 <= seconds <= after + 1


async def test_a_label_is_recorded_and_seen_by_the_next_call_of_its_conversation(
        recording: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = recording
    before = time.time()
    result = await execute(pipeline, "read_labelled", "c1", add=["restricted"])
    after = time.time()
    assert result.status is Status.SUCCESS and result.data == {"text": "doc", "pid": os.getpid()}
    assert engine.last_labels() == []  # its own decisions came before its result
    assert (await execute(pipeline, "echo", "c1", text="next")).status is Status.SUCCESS
    [seen] = engine.last_labels()
    assert seen == labelled("restricted", "read_labelled", seen["time"])
    assert_recent(seen["time"], before, after)
    assert engine.authz[-1]["conversation"]["id"] == "c1"
    [event] = await events(pipeline, DEVELOPER, "c1")
    assert (event.kind, event.name, event.tool, event.detail) == (EventKind.LABEL, "restricted", "read_labelled", "")


async def test_another_conversation_or_principal_does_not_see_the_label(
        recording: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = recording
    assert (await execute(pipeline, "read_labelled", "c1", add=["restricted"])).status is Status.SUCCESS
    assert (await execute(pipeline, "echo", "c2")).status is Status.SUCCESS
    assert engine.last_labels() == []
    assert (await execute(pipeline, "echo", None)).status is Status.SUCCESS
    assert engine.last_labels() == []
    assert (await execute(pipeline, "echo", "c1", who=ADMIN)).status is Status.SUCCESS  # another principal's c1
    assert engine.last_labels() == []
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert [entry["label"] for entry in engine.last_labels()] == ["restricted"]
    assert await events(pipeline, DEVELOPER, "c2") == [] and await events(pipeline, ADMIN, "c1") == []


async def test_calls_without_a_conversation_share_one_per_principal(
        recording: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = recording
    assert (await execute(pipeline, "read_labelled", None, add=["untrusted"])).status is Status.SUCCESS
    assert (await execute(pipeline, "echo", None)).status is Status.SUCCESS
    assert [(e["label"], e["tool"]) for e in engine.last_labels()] == [("untrusted", "read_labelled")]
    assert (await execute(pipeline, "echo", None, who=ADMIN)).status is Status.SUCCESS
    assert engine.last_labels() == []


async def test_each_label_of_each_tool_is_recorded_once(recording: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = recording
    for add in (["restricted"], ["restricted", "untrusted"], ["untrusted"]):
        assert (await execute(pipeline, "read_labelled", "c1", add=add)).status is Status.SUCCESS
    assert (await execute(pipeline, "read_labelled_sync", "c1", add=["restricted"])).status is Status.SUCCESS
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert [(e["label"], e["tool"]) for e in engine.last_labels()] == [
        ("restricted", "read_labelled"), ("untrusted", "read_labelled"), ("restricted", "read_labelled_sync")]
    assert [(e.name, e.tool) for e in await events(pipeline, DEVELOPER, "c1")] == [
        ("restricted", "read_labelled"), ("untrusted", "read_labelled"), ("restricted", "read_labelled_sync")]


async def test_a_label_of_a_call_that_failed_is_not_recorded(recording: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = recording
    failed = await execute(pipeline, "read_labelled", "c1", add=["restricted"], fail=True)
    assert failed.status is Status.ERROR and failed.error is not None
    assert failed.error.code is ErrorCode.RESOURCE_NOT_FOUND
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert engine.last_labels() == []
    assert await events(pipeline, DEVELOPER, "c1") == []


async def test_a_label_of_a_failed_attempt_is_not_carried_by_the_retried_result(
        recording: tuple[Pipeline, RecordingEngine]) -> None:
    """Only the result given carries labels: the first attempt's failed, the second added none (as a worker
    process returns labels only with a result)."""
    pipeline, engine = recording
    result = await execute(pipeline, "read_flaky", "c1", add=["restricted"])
    assert result.status is Status.SUCCESS and result.meta.attempt == 2
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert engine.last_labels() == []
    assert await events(pipeline, DEVELOPER, "c1") == []


async def test_a_label_of_a_result_too_large_to_return_is_not_recorded(make_pipeline: PipelineFactory) -> None:
    """The result is not returned (``INTERNAL_ERROR``): the conversation did not get what the label marks."""
    engine = RecordingEngine(EmbeddedEngine.load(bundled_policy_dir()))
    pipeline = await make_pipeline(policy=engine, registry=REGISTRY, max_result_bytes=1000)
    failed = await execute(pipeline, "read_labelled", "c1", text="x" * 2000, add=["restricted"])
    assert failed.status is Status.ERROR and failed.error is not None and failed.data is None
    assert failed.error.code is ErrorCode.INTERNAL_ERROR and "it was not returned" in failed.error.message
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert engine.last_labels() == []


async def test_an_undeclared_label_fails_the_call_and_is_not_recorded(
        recording: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = recording
    failed = await execute(pipeline, "read_labelled", "c1", add=["restricted", "secret"])
    assert failed.status is Status.ERROR and failed.error is not None
    assert failed.error.code is ErrorCode.INTERNAL_ERROR
    assert "secret" not in failed.error.message  # the handler's exception is for the log, not the model
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert engine.last_labels() == []


async def test_a_policy_set_that_reads_no_labels_records_none(make_pipeline: PipelineFactory,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "allowing"
    root.mkdir()
    for name, text in ALLOWING.items():
        (root / name).write_text(text)
    engine = RecordingEngine(EmbeddedEngine.load(root))
    assert not (await engine.history_needs()).any
    pipeline = await make_pipeline(policy=engine, registry=REGISTRY)
    assert (await execute(pipeline, "read_labelled", "c1", add=["restricted"])).status is Status.SUCCESS
    assert (await execute(pipeline, "read_labelled", "c1", add=["untrusted"], fail=True)).status is Status.ERROR
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert "conversation" not in engine.authz[-1] and "history" not in engine.authz[-1]
    assert await events(pipeline, DEVELOPER, "c1") == []
    assert history_rows(tmp_path) == 0


# --- labels from a worker process -------------------------------------------------------------------------


def test_a_handler_run_for_a_worker_returns_its_labels() -> None:
    request = Request("read_labelled_sync", Doc(add=["restricted"]), Principal(id="u1"), "r-1", 5.0, None, 1,
                      "test", {}, declared_labels=frozenset({"restricted"}))
    ours = Read(text="doc", pid=os.getpid())
    assert _run(read_labelled_sync.handler, request) == Returned(ours, frozenset({"restricted"}))
    plain = Request("read_labelled_sync", Doc(), Principal(id="u1"), "r-2", 5.0, None, 1, "test", {},
                    declared_labels=frozenset({"restricted"}))
    assert _run(read_labelled_sync.handler, plain) == Returned(ours, frozenset())


def test_a_worker_handler_refusing_after_a_label_returns_no_labels() -> None:
    request = Request("read_labelled_sync", Doc(add=["restricted"], fail=True), Principal(id="u1"), "r-1", 5.0,
                      None, 1, "test", {}, declared_labels=frozenset({"restricted"}))
    refused = _run(read_labelled_sync.handler, request)
    assert isinstance(refused, Refused) and refused.code == "RESOURCE_NOT_FOUND"


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    started = await Worker.spawn("labels", {"read_labelled_sync": handler_path(read_labelled_sync)},
                                 on_end=lambda _: None, timeout=60)
    yield started
    await started.stop(0)


async def test_labels_added_in_a_worker_process_reach_the_context(worker: Worker) -> None:
    ctx = context(read_labelled_sync.labels)
    returned = await worker.call("read_labelled_sync", Doc(text="x", add=["restricted"]), ctx)
    assert returned == Read(text="x", pid=worker.pid)
    assert ctx.labels == {"restricted"}
    again = context(read_labelled_sync.labels)
    assert await worker.call("read_labelled_sync", Doc(text="y"), again) == Read(text="y", pid=worker.pid)
    assert again.labels == set()  # the worker's next call starts without the last one's labels


async def test_an_undeclared_label_in_a_worker_process_fails_the_handler(worker: Worker) -> None:
    ctx = context(read_labelled_sync.labels)
    with pytest.raises(HandlerFailed) as failed:
        await worker.call("read_labelled_sync", Doc(add=["secret"]), ctx)
    assert "ValueError: label 'secret' is not one the tool declares" in str(failed.value)
    assert ctx.labels == set()
    with pytest.raises(ToolError):
        await worker.call("read_labelled_sync", Doc(add=["restricted"], fail=True), ctx)
    assert ctx.labels == set()


@pytest.fixture
async def isolated_pipeline(tmp_path: Path) -> AsyncIterator[tuple[Pipeline, RecordingEngine]]:
    engine = RecordingEngine(EmbeddedEngine.load(bundled_policy_dir()))
    store = await SqliteStore.open(tmp_path / "isolated.db")
    isolation = IsolationSettings(tools=("read_labelled_sync", "read_flaky_sync"), workers_per_plugin=1)
    pipeline = assemble(registry=REGISTRY, policy=engine, store=store, limits=Limits(), isolation=isolation)
    try:
        await pipeline.dispatcher.start()  # the worker imports the handler now, not within the first call's deadline
        yield pipeline, engine
    finally:
        await pipeline.aclose()


async def test_a_label_from_an_isolated_handler_is_recorded_and_seen(
        isolated_pipeline: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = isolated_pipeline
    result = await execute(pipeline, "read_labelled_sync", "c1", add=["restricted"])
    assert result.status is Status.SUCCESS, result.error
    assert result.data is not None and result.data["pid"] != os.getpid()  # it ran in a worker process
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert [(e["label"], e["tool"]) for e in engine.last_labels()] == [("restricted", "read_labelled_sync")]
    failed = await execute(pipeline, "read_labelled_sync", "c2", add=["restricted"], fail=True)
    assert failed.status is Status.ERROR
    assert (await execute(pipeline, "echo", "c2")).status is Status.SUCCESS
    assert engine.last_labels() == []


async def test_a_label_of_a_failed_attempt_in_a_worker_process_is_not_recorded(
        isolated_pipeline: tuple[Pipeline, RecordingEngine]) -> None:
    pipeline, engine = isolated_pipeline
    result = await execute(pipeline, "read_flaky_sync", "c1", add=["restricted"])
    assert result.status is Status.SUCCESS and result.meta.attempt == 2
    assert result.data is not None and result.data["pid"] != os.getpid()
    assert (await execute(pipeline, "echo", "c1")).status is Status.SUCCESS
    assert engine.last_labels() == []
