"""Sensitive argument values: real for policies and handlers, masked in the audit log, absent from the logs."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, SecretStr

from sidecar.bootstrap import assemble, open_pipeline
from sidecar.config import Limits, bundled_policy_dir, parse_settings
from sidecar.contract import CallRequest, Status
from sidecar.errors import ConfigError, PolicyLoadError
from sidecar.pipeline.dry_run import Verdict, dry_run
from sidecar.pipeline.replay import Recorded, replay
from sidecar.plugin import SideEffect, ToolContext, tool
from sidecar.policy import Decision, DelegatingEngine, PolicyEngine, Stage, parse_audit_masks
from sidecar.policy.cache import CachingEngine
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.input import PolicyInput
from sidecar.state.sqlite import SqliteStore
from sidecar.tools import masking
from sidecar.tools.masking import SENSITIVE, Masker, Revealed, reveal
from sidecar.tools.registry import Registry
from tests.conftest import DEVELOPER

PASSWORD, NOTE = "hunter2-sesame-4711", "a private note 0815"
KEY = b"k" * 32
SEEN_BY_HANDLER: list[str] = []


class Recipient(BaseModel):
    email: str
    password: SecretStr


class Login(BaseModel):
    recipients: list[Recipient]
    note: str = Field(json_schema_extra=SENSITIVE)
    subject: str


@tool(name="login", version="1.0.0", side_effect=SideEffect.NONE)
async def login(args: Login, ctx: ToolContext) -> Login:
    """Keep what the handler was given."""
    SEEN_BY_HANDLER.append(args.recipients[0].password.get_secret_value())
    logging.getLogger("toolbooth.test").debug("handler ran for %s", ctx.request_id)
    return args


class RecordingEngine(DelegatingEngine):
    """Passes decisions through and keeps every input document."""

    def __init__(self, inner: PolicyEngine) -> None:
        super().__init__(inner)
        self.seen: list[Any] = []

    async def decide(self, stage: Stage, input: PolicyInput) -> Decision:
        self.seen.append(input.document())
        return await self.inner.decide(stage, input)

    async def decide_many(self, stage: Stage, inputs: Sequence[PolicyInput]) -> list[Decision]:
        return [await self.decide(stage, i) for i in inputs]


ARGUMENTS = {"recipients": [{"email": "a@example.com", "password": PASSWORD}], "note": NOTE, "subject": "hi"}


def test_reveal_keeps_secrets_and_finds_sensitive_pointers() -> None:
    revealed = reveal(Login.model_validate(ARGUMENTS))
    assert revealed.data == ARGUMENTS
    assert revealed.sensitive == {"/recipients/0/password", "/note"}


class Plain(BaseModel):
    name: str
    sizes: dict[str, list[float]] = {}
    kind: Literal["a", "b"] = "a"
    children: list[Plain] = []


class Wrapped(BaseModel):
    inner: Plain | None = None
    logins: tuple[Login, ...] = ()  # a secret two levels down, behind a model that is plain


class Loose(BaseModel):
    anything: Any = None


def test_a_model_that_cannot_hold_secrets_is_revealed_without_a_walk() -> None:
    arguments = {"name": "n", "sizes": {"x": [1.5]}, "kind": "b", "children": [{"name": "c"}]}
    assert reveal(Plain.model_validate(arguments)) == Revealed(Plain.model_validate(arguments).model_dump(),
                                                               frozenset())
    assert masking._plain(Plain) and not masking._plain(Wrapped) and not masking._plain(Loose)
    assert not masking._plain(Login) and not masking._plain(Recipient)


def test_a_secret_behind_a_plain_model_is_still_found() -> None:
    revealed = reveal(Wrapped.model_validate({"inner": {"name": "n"}, "logins": [ARGUMENTS]}))
    assert revealed.data["logins"][0] == ARGUMENTS
    assert revealed.sensitive == {"/logins/0/recipients/0/password", "/logins/0/note"}


def test_equal_values_mask_equally_and_keys_differ() -> None:
    masker = Masker(KEY)
    masked = masker.mask({"a": "x", "b": ["x", {"c/d": "y"}]}, ["/a", "/b/0", "/b/1/c~1d", "/missing/0"])
    assert masked["a"] == masked["b"][0] == masker.mask_value("x") and masked["a"].startswith("hmac-sha256:")
    assert masked["b"][1]["c/d"] == masker.mask_value("y") != masked["a"]
    assert Masker(b"other-key-0123456789").mask_value("x") != masker.mask_value("x")
    assert masker.mask({"a": 1}, [""]) == masker.mask_value({"a": 1})


async def test_a_call_masks_its_audit_and_logs_nothing_sensitive(tmp_path: Path, default_engine: Any,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    engine = RecordingEngine(default_engine)
    store = await SqliteStore.open(tmp_path / "store.db")
    pipeline = assemble(registry=Registry.from_tools([login]), policy=engine, store=store, limits=Limits(),
                        mask_key=KEY)
    try:
        with caplog.at_level(logging.DEBUG):
            result = await pipeline.execute(DEVELOPER, CallRequest(tool="login", arguments_json=json.dumps(ARGUMENTS)))
            [event] = await store.audit_events()
    finally:
        await pipeline.aclose()
    assert result.status is Status.SUCCESS and SEEN_BY_HANDLER[-1] == PASSWORD
    assert engine.seen[-1]["call"]["arguments"] == ARGUMENTS  # policies decide on the real values
    assert event.arguments_json is not None
    recorded = json.loads(event.arguments_json)
    masker = Masker(KEY)
    assert recorded == {"recipients": [{"email": "a@example.com", "password": masker.mask_value(PASSWORD)}],
                        "note": masker.mask_value(NOTE), "subject": "hi"}
    assert "handler ran for" in caplog.text
    for secret in (PASSWORD, NOTE):
        assert secret not in caplog.text and secret not in event.arguments_json


async def test_policy_eval_gives_the_policies_exactly_the_input_of_a_real_call(tmp_path: Path,
                                                                               default_engine: Any) -> None:
    """``toolbooth policy eval`` runs the sidecar's own stages: a ``SecretStr`` reaches the policy in clear in both
    (a hand-built copy of the stages once showed the policy ``'**********'`` in the dry run only)."""
    real, dry = RecordingEngine(default_engine), RecordingEngine(default_engine)
    store = await SqliteStore.open(tmp_path / "store.db")
    pipeline = assemble(registry=Registry.from_tools([login]), policy=real, store=store, limits=Limits())
    try:
        result = await pipeline.execute(DEVELOPER, CallRequest(tool="login", arguments_json=json.dumps(ARGUMENTS)))
    finally:
        await pipeline.aclose()
    run = await dry_run(dry, login, DEVELOPER, json.dumps(ARGUMENTS), limits=Limits(), time="2026-01-01T00:00:00Z")
    assert result.status is Status.SUCCESS and run.verdict is Verdict.WOULD_RUN

    def timeless(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**doc, "context": {k: v for k, v in doc["context"].items() if k != "time"}} for doc in documents]

    assert [doc["context"]["stage"] for doc in real.seen] == ["availability", "authz", "approval"]
    assert timeless(dry.seen) == timeless(real.seen)
    assert dry.seen[-1]["call"]["arguments"]["recipients"][0]["password"] == PASSWORD
    assert {doc["context"]["time"] for doc in dry.seen} == {"2026-01-01T00:00:00Z"}


def test_mask_key_settings(tmp_path: Path) -> None:
    key_file = tmp_path / "mask.key"
    key_file.write_text("0123456789abcdef0123\n")
    assert parse_settings({"audit": {"mask_key_file": str(key_file)}}).audit.read_mask_key() == b"0123456789abcdef0123"
    assert parse_settings({"audit": {"mask_key": "x" * 16}}).audit.read_mask_key() == b"x" * 16
    assert parse_settings({}).audit.read_mask_key() is None
    with pytest.raises(ConfigError, match=r"audit\.mask_key: must be at least 16 bytes"):
        parse_settings({"audit": {"mask_key": "short"}})
    with pytest.raises(ConfigError, match="at most one"):
        parse_settings({"audit": {"mask_key": "x" * 16, "mask_key_file": str(key_file)}})
    key_file.write_text("short")
    with pytest.raises(ConfigError, match="fewer than 16 bytes"):
        parse_settings({"audit": {"mask_key_file": str(key_file)}}).audit.read_mask_key()


async def test_without_a_configured_key_the_store_keeps_one_across_restarts(tmp_path: Path) -> None:
    settings = parse_settings({"store": {"sqlite_path": str(tmp_path / "store.db")}})
    recorded = []
    for _ in range(2):  # two runs of the sidecar on one store
        pipeline = await open_pipeline(settings, registry=Registry.from_tools([login]))
        try:
            await pipeline.execute(DEVELOPER, CallRequest(tool="login", arguments_json=json.dumps(ARGUMENTS)))
            recorded.append((await pipeline.store.audit_events())[-1].arguments_json)  # type: ignore[attr-defined]
        finally:
            await pipeline.aclose()
    assert recorded[0] == recorded[1] and PASSWORD not in str(recorded[0])


def policies_masking(tmp_path: Path, mask: Any) -> EmbeddedEngine:
    """The default policies, with ``data.toolbooth.audit.mask`` set to ``mask``."""
    path = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    data = json.loads((path / "data.json").read_text())
    data["toolbooth"]["audit"] = {"mask": mask}
    (path / "data.json").write_text(json.dumps(data))
    return EmbeddedEngine.load(path)


async def run_login(tmp_path: Path, policy: Any) -> tuple[Status, str | None]:
    store = await SqliteStore.open(tmp_path / "masked.db")
    pipeline = assemble(registry=Registry.from_tools([login]), policy=policy, store=store, limits=Limits(),
                        mask_key=KEY)
    try:
        result = await pipeline.execute(DEVELOPER, CallRequest(tool="login", arguments_json=json.dumps(ARGUMENTS)))
        [event] = await store.audit_events()
    finally:
        await pipeline.aclose()
    return result.status, event.arguments_json


async def test_the_policy_masks_more_pointers(tmp_path: Path) -> None:
    engine = policies_masking(tmp_path, {"login": ["/subject", "/recipients/0/email", "/absent"], "other": ["/x"]})
    cached = CachingEngine(engine, max_entries=10, ttl_seconds=5)
    assert await cached.audit_masks() == {"login": ("/subject", "/recipients/0/email", "/absent"), "other": ("/x",)}
    status, recorded = await run_login(tmp_path, cached)
    masker = Masker(KEY)
    assert status is Status.SUCCESS and json.loads(recorded or "") == {
        "recipients": [{"email": masker.mask_value("a@example.com"), "password": masker.mask_value(PASSWORD)}],
        "note": masker.mask_value(NOTE), "subject": masker.mask_value("hi")}


def test_a_malformed_mask_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match=r"data\.toolbooth\.audit\.mask must map tool names to lists"):
        policies_masking(tmp_path, {"login": "/subject"})


class MalformedMasks(RecordingEngine):
    """An engine (like OPA) whose masks turn out malformed only when asked."""

    async def audit_masks(self) -> dict[str, tuple[str, ...]]:
        return parse_audit_masks({"login": "/subject"})


async def test_a_malformed_mask_denies_the_call(tmp_path: Path, default_engine: Any) -> None:
    runs = len(SEEN_BY_HANDLER)
    status, recorded = await run_login(tmp_path, MalformedMasks(default_engine))
    assert status is Status.ERROR and recorded is None and len(SEEN_BY_HANDLER) == runs


class Count(BaseModel):
    count: int


@tool(name="leaky", version="1.0.0", side_effect=SideEffect.NONE)
async def leaky(args: Recipient, ctx: ToolContext) -> Count:
    """Return a result that does not fit, echoing a secret argument."""
    return {"count": args.password.get_secret_value()}  # type: ignore[return-value]


async def test_an_output_that_does_not_fit_is_logged_without_its_values(tmp_path: Path, default_engine: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    store = await SqliteStore.open(tmp_path / "store.db")
    pipeline = assemble(registry=Registry.from_tools([leaky]), policy=default_engine, store=store, limits=Limits())
    arguments = json.dumps({"email": "a@example.com", "password": PASSWORD})
    try:
        with caplog.at_level(logging.DEBUG):
            result = await pipeline.execute(DEVELOPER, CallRequest(tool="leaky", arguments_json=arguments))
    finally:
        await pipeline.aclose()
    assert result.status is Status.ERROR
    assert "returned a value that does not fit Count: count: Input should be a valid integer" in caplog.text
    assert PASSWORD not in caplog.text


async def test_a_replay_gives_the_policies_the_recorded_inputs_with_the_masks(tmp_path: Path,
                                                                               default_engine: Any) -> None:
    engine = RecordingEngine(default_engine)
    store = await SqliteStore.open(tmp_path / "store.db")
    pipeline = assemble(registry=Registry.from_tools([login]), policy=engine, store=store, limits=Limits(),
                        mask_key=KEY)
    try:
        request = CallRequest(tool="login", arguments_json=json.dumps(ARGUMENTS), conversation_id="conv-1",
                              idempotency_key="k-1", call_id="c-1")
        assert (await pipeline.execute(DEVELOPER, request)).status is Status.SUCCESS
        await store.flush_audit()
        [record] = await store.audit_records()
    finally:
        await pipeline.aclose()
    then = engine.seen[-3:]  # availability, authz, approval
    recorded = Recorded.of(record)
    assert isinstance(recorded, Recorded)
    again = RecordingEngine(EmbeddedEngine.load(bundled_policy_dir()))
    assert await replay(again, recorded) is None
    masker = Masker(KEY)
    masked = {"recipients": [{"email": "a@example.com", "password": masker.mask_value(PASSWORD)}],
              "note": masker.mask_value(NOTE), "subject": "hi"}
    for before, now in zip(then, again.seen, strict=True):  # the very inputs, the sensitive values masked
        if "call" in before:
            assert before["call"]["arguments"] == ARGUMENTS and now["call"]["arguments"] == masked
            before["call"]["arguments"] = masked
        assert now == before
    assert len(again.seen) == 3 and again.seen[1]["call"]["conversation_id"] == "conv-1"
