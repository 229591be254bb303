"""A call's history through real sidecars on real sockets, on SQLite and on PostgreSQL: a meter's limit holds
exactly under 64 concurrent callers, in one sidecar and across two processes sharing PostgreSQL (a meter that sums
too), a refused call or one whose caller left before it ran does not use it up, and the retries of one keyed write
hold one place; ``RATE_LIMITED`` (with ``retry_after_seconds``) reaches every transport; the loop
breaker stops the fourth identical failing call of a conversation; the default policies keep a conversation that
read a restricted document (the documents plugin) from previewing mail outside the organization (the email
plugin), name its labels in an approval's reason, and remember them across a restart; a store that cannot
answer the history refuses the call (nothing runs); ``toolbooth policy replay`` decides again on the history each
call saw.

The sidecars run in JWT mode, so that each test's principals are its own (meters count by principal); their
policies are the bundled ones, with small limits where a test needs them (``tests.support.history.with_meters``).
Handlers count their runs; nothing waits a fixed time.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import psycopg
import pytest
from pydantic import BaseModel, ConfigDict

from sidecar.bootstrap import open_pipeline
from sidecar.cli import main
from sidecar.client import AsyncClient, call_request
from sidecar.config import Settings, bundled_policy_dir
from sidecar.contract import RETRY_AFTER_SECONDS, ErrorCode, Recovery, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.pipeline.call import Call
from sidecar.pipeline.chain import Next
from sidecar.pipeline.order import Stages
from sidecar.plugin import SideEffect, ToolContext, ToolError, tool
from sidecar.server import Sidecar
from sidecar.server.http_json import HttpJsonEndpoint
from sidecar.server.mcp_http import McpEndpoint
from sidecar.tools.registry import Registry
from tests.contract.conftest import postgres, postgres_dsn
from tests.support import tools
from tests.support.history import with_meters
from tests.support.mcp import http_client, http_session, typed
from tests.support.sidecar_process import SidecarProcess, appended
from tests.support.signing_keys import key_pair
from tests.support.tools import Count, Text
from tests.support.tools import Counter as Runs
from tests.support.waiting import until
from toolbooth_documents.index import open_index
from toolbooth_documents.loader import load_directory
from toolbooth_documents.settings import IndexSettings

pytestmark = pytest.mark.integration
__all__ = ["postgres", "postgres_dsn"]

Tokens = Callable[..., str]
WRITE_EFFECTS = ["internal_reversible", "external_reversible", "external_irreversible"]
OUTSIDE = {"recipients": [{"email": "bo@partner.org"}], "subject": "Figures", "body_text": "As discussed."}
INSIDE = {"recipients": [{"email": "ana@example.com"}], "subject": "Figures", "body_text": "As discussed."}
EXFILTRATION = ('this conversation read data labelled "restricted" (from read_document); it may not be sent '
                "outside the organization (partner.org)")
LOOP = ("this call failed 3 times in this conversation (RESOURCE_NOT_FOUND): stop repeating it; change its "
        "arguments or ask the user")
# What the exfiltrating principal holds besides the developer role (directly: the documents plugin reads it so).
EXTERNAL_READER = ("documents:read_restricted", "email:send_external")


def writes(limit: int) -> dict[str, Any]:
    """A meter ``writes``: ``limit`` calls of tools with side effects per principal a minute."""
    return {"writes": {"by": ["principal"], "window_seconds": 60, "side_effects": WRITE_EFFECTS, "limit": limit}}


def limited_message(limit: int, retry: int) -> str:
    calls = "1 call" if limit == 1 else f"{limit} calls"
    seconds = "1 second" if retry == 1 else f"{retry} seconds"
    return f"rate limit writes reached: {calls} per 60 seconds; retry in {seconds}"


# --- tools of these tests ---------------------------------------------------------------------------------------


class Lookup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


MISSES = Runs()


@tool(name="lookup_record", version="1.0.0", side_effect=SideEffect.NONE, timeout=5)
async def lookup_record(args: Lookup, ctx: ToolContext) -> Text:
    """Always fails the same way (a record that does not exist), counting its runs."""
    MISSES.bump()
    raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, f"there is no record {args.name!r}", field="name")


PURGED = Runs()


@tool(name="purge_notes", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5,
      permissions=("records:delete",))
async def purge_notes(args: Text, ctx: ToolContext) -> Count:
    """A write needing a permission the developer role lacks: the policy denies it before it runs."""
    return Count(count=PURGED.bump())


READS = Runs()


@tool(name="counted_read", version="1.0.0", side_effect=SideEffect.NONE, timeout=5)
async def counted_read(args: Text, ctx: ToolContext) -> Text:
    """A read counting its runs."""
    READS.bump()
    return args


SECRET_READS = Runs()
WHILE_READING: list[Callable[[], None]] = []  # what secret_read does while it runs, in a thread (a test's)


@tool(name="secret_read", version="1.0.0", side_effect=SideEffect.NONE, timeout=10, labels=("secret",))
async def secret_read(args: Text, ctx: ToolContext) -> Text:
    """A read whose result is labelled ``secret``, counting its runs."""
    SECRET_READS.bump()
    for action in WHILE_READING:
        await asyncio.to_thread(action)
    ctx.add_label("secret")
    return args


FILED = Runs()


@tool(name="file_record", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5)
async def file_record(args: Lookup, ctx: ToolContext) -> Text:
    """A write that always fails the same way (the folder it files into does not exist), counting its runs."""
    FILED.bump()
    raise ToolError(ErrorCode.RESOURCE_NOT_FOUND, f"there is no folder for {args.name!r}", field="name")


OWN = [lookup_record, purge_notes, counted_read, secret_read, file_record]


def basic_registry() -> Registry:
    """The test tools (``create_note`` writes, ``send_email`` needs approval) and those of this module."""
    return Registry.from_tools([*tools.ALL, *OWN])


# --- the documents and email plugins ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Documents:
    """The installed documents and email plugins, configured under ``root``: acme's project alpha holds the
    open document ``plan`` and the restricted one ``budget``."""

    registry: Registry
    plan: str
    budget: str


async def documents(root: Path) -> Documents:
    index_settings = IndexSettings(sqlite_path=root / "documents.db")
    index = open_index(index_settings)
    ids: dict[str, str] = {}
    for restricted, name, text in ((False, "plan.md", "# Launch plan\nThe launch figures are final.\n"),
                                   (True, "budget.md", "# Launch budget\nThe salary figures are 12345.\n")):
        directory = root / "corpus" / ("restricted" if restricted else "open")
        directory.mkdir(parents=True)
        (directory / name).write_text(text, encoding="utf-8")
        loaded, skipped = load_directory(directory, tenant="acme", project_id="alpha", restricted=restricted)
        assert not skipped and len(loaded) == 1
        await index.add_project("acme", "alpha")
        await index.upsert(loaded)
        ids[name] = loaded[0].document_id
    plugins = Registry.from_entry_points(allow=["documents", "email"], config={
        "documents": {"sqlite_path": str(index_settings.sqlite_path)},
        "email": {"drafts_path": str(root / "drafts.db")},
    })
    registry = Registry.from_tools([*plugins, tools.create_note, *OWN])
    return Documents(registry, ids["plan.md"], ids["budget.md"])


# --- sidecars ---------------------------------------------------------------------------------------------------


@dataclass
class Running:
    """One started sidecar (gRPC on ``target``) over its pipeline; clients with tokens of any principal."""

    settings: Settings
    pipeline: Pipeline
    sidecar: Sidecar
    tokens: Tokens
    clients: list[AsyncClient] = field(default_factory=list)
    stopped: bool = False

    @property
    def target(self) -> str:
        return self.sidecar.addresses[-1]

    def token(self, sub: str, roles: Sequence[str] = ("developer",), permissions: Sequence[str] = ()) -> str:
        return self.tokens(sub=sub, roles=list(roles), permissions=list(permissions))

    def client(self, sub: str, roles: Sequence[str] = ("developer",),
               permissions: Sequence[str] = ()) -> AsyncClient:
        self.clients.append(client := AsyncClient(self.target, token=self.token(sub, roles, permissions), timeout=60))
        return client

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await asyncio.gather(*(client.close() for client in self.clients))
        await self.sidecar.stop(None)
        await self.pipeline.aclose()


Serve = Callable[..., Awaitable[Running]]


@pytest.fixture(params=["sqlite", "postgres"])
def store_section(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The ``store`` section of the test's sidecars: a SQLite file in ``tmp_path``, or a fresh PostgreSQL schema."""
    if request.param == "postgres":
        return {"postgres_dsn": request.getfixturevalue("postgres_dsn")}
    return {"sqlite_path": str(tmp_path / "toolbooth.db")}


@pytest.fixture
async def serve(make_settings: Callable[..., Settings], jwt_auth: dict[str, Any], make_token: Tokens,
                start_sidecar: Any) -> AsyncIterator[Serve]:
    """``await serve(registry, policies=..., store=..., stages=..., **sections)``: a started sidecar in JWT mode
    over ``registry``, deciding with the policy directory ``policies`` (default: the bundled one), on the store
    ``store`` (default: a SQLite file in the test's directory), with ``stages`` added to its chain; every one is
    stopped at teardown."""
    running: list[Running] = []

    async def start(registry: Registry, *, policies: Path | None = None, store: dict[str, Any] | None = None,
                    stages: Stages | None = None, **sections: dict[str, Any]) -> Running:
        policy = {"path": str(policies or bundled_policy_dir()), "reload_interval_seconds": 0}
        settings = make_settings(auth=jwt_auth, policy=policy, **({"store": store} if store else {}), **sections)
        pipeline = await open_pipeline(settings, registry=registry, stages=stages)
        try:
            sidecar = await start_sidecar(settings, pipeline)
        except BaseException:
            await pipeline.aclose()
            raise
        running.append(started := Running(settings, pipeline, sidecar, make_token))
        return started

    yield start
    for each in running:
        await each.stop()


def code(result: ToolResult) -> str:
    """What a result was: ``success``, ``approval_required`` or its error's code."""
    return result.error.code.value if result.error is not None else result.status.value


def outcomes(results: Sequence[ToolResult]) -> Counter[str]:
    return Counter(code(result) for result in results)


def assert_rate_limited(result: ToolResult, limit: int) -> int:
    """``result`` is a ``RATE_LIMITED`` refusal of a call that never ran, saying when to retry; that retry."""
    error = result.error
    assert result.status is Status.ERROR and error is not None and error.code is ErrorCode.RATE_LIMITED, result
    assert (error.retryable, error.recovery) == (True, Recovery.RETRY_WITH_BACKOFF)
    assert error.details is not None and set(error.details) == {RETRY_AFTER_SECONDS}, error.details
    retry = error.details[RETRY_AFTER_SECONDS]
    assert type(retry) is int and 1 <= retry <= 60, retry
    assert error.retry_after_seconds == retry
    assert error.message == limited_message(limit, retry)
    assert result.meta.attempt == 0 and result.data is None
    return retry


# --- 1. the limit holds exactly, on each store ---------------------------------------------------------------


async def test_a_limit_of_five_lets_exactly_five_of_64_concurrent_writes_run(serve: Serve,
                                                                          store_section: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(5)),
                          store=store_section)
    alice = running.client("alice")
    before = tools.CREATED.value
    results = await asyncio.gather(*(alice.execute("create_note", {"text": f"note {n}"}, idempotency_key=f"k-{n}")
                                     for n in range(64)))
    assert outcomes(results) == {"success": 5, "RATE_LIMITED": 59}, outcomes(results)
    assert tools.CREATED.value - before == 5  # the handler ran once per call let through, never for a refused one
    ran = sorted(result.data["count"] for result in results if result.data is not None)
    assert ran == list(range(before + 1, before + 6))
    for result in results:
        if result.status is not Status.SUCCESS:
            assert_rate_limited(result, 5)
    # The limit is alice's: another principal writes as before, and reads are not metered at all.
    bob = running.client("bob")
    assert code(await bob.execute("create_note", {"text": "bob"}, idempotency_key="k-0")) == "success"
    assert code(await alice.execute("counted_read", {"text": "still reading"})) == "success"
    assert tools.CREATED.value - before == 6


async def test_calls_refused_for_another_reason_do_not_use_the_limit_up(serve: Serve, store_section: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(5)),
                          store=store_section)
    dora = running.client("dora")
    before = tools.CREATED.value
    for n in range(2):
        first = await dora.execute("create_note", {"text": f"first {n}"}, idempotency_key=f"first-{n}")
        assert code(first) == "success", first
    # A retry of a finished write is replayed: it does not run, and counts nothing.
    again = await dora.execute("create_note", {"text": "first 0"}, idempotency_key="first-0")
    assert code(again) == "success" and again.meta.idempotency_replayed
    # Held for approval (send_email is external and irreversible) or denied (a permission dora lacks), while
    # the limit has room: each was counted while it was decided, and given back once it did not run. (One after
    # the other: calls being decided hold their places, so concurrent ones could find the limit reached.)
    refused = []
    for n in range(6):
        refused.append(await dora.execute("send_email", {"text": f"mail {n}"}, idempotency_key=f"mail-{n}"))
        refused.append(await dora.execute("purge_notes", {"text": f"purge {n}"}, idempotency_key=f"purge-{n}"))
    assert outcomes(refused) == {"APPROVAL_REQUIRED": 6, "PERMISSION_DENIED": 6}, outcomes(refused)
    assert all(result.meta.attempt == 0 for result in refused) and PURGED.value == 0
    # So three of the five places are left, exactly.
    rest = await asyncio.gather(*(dora.execute("create_note", {"text": f"rest {n}"}, idempotency_key=f"rest-{n}")
                                  for n in range(10)))
    assert outcomes(rest) == {"success": 3, "RATE_LIMITED": 7}, outcomes(rest)
    assert tools.CREATED.value - before == 5
    # A limited principal's refusals for other reasons still say their own reason (permissions come first).
    denied = await dora.execute("purge_notes", {"text": "purge late"}, idempotency_key="purge-late")
    assert code(denied) == "PERMISSION_DENIED"


class Holding:
    """A stage added after the decisions: holds the first ``create_note`` call of text ``hold`` (its meter place
    reserved, its key not claimed yet) until ``release`` is set; ``arrived`` is set once it is held. Later calls
    pass."""

    def __init__(self) -> None:
        self.arrived, self.release = asyncio.Event(), asyncio.Event()

    async def run(self, call: Call, next: Next) -> ToolResult:
        if call.defn.name == "create_note" and call.validated.data.get("text") == "hold" and not self.arrived.is_set():
            self.arrived.set()
            await self.release.wait()
        return await next(call)


async def reserved(running: Running) -> int:
    """How many meter places the store holds (``call`` events of the history)."""
    [(count,)] = await running.pipeline.store.driver.fetch(  # type: ignore[attr-defined]
        "SELECT count(*) FROM toolbooth_history WHERE kind = 'call'")
    return int(count)


async def fewer_places(running: Running, places: int) -> bool:
    return await reserved(running) < places


async def test_a_call_being_decided_holds_its_place_and_gives_it_back_when_its_caller_leaves(
        serve: Serve, store_section: dict[str, Any], tmp_path: Path) -> None:
    holding = Holding()
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(2)),
                          store=store_section, stages=Stages(after_decisions=[holding]))
    erin = running.client("erin")
    before = tools.CREATED.value
    try:
        held = asyncio.create_task(erin.execute("create_note", {"text": "hold"}, idempotency_key="held"))
        await asyncio.wait_for(holding.arrived.wait(), 30)
        assert await reserved(running) == 1
        # While it is decided, it holds one of the two places: of two more, one runs.
        during = await asyncio.gather(*(erin.execute("create_note", {"text": f"d {n}"}, idempotency_key=f"d-{n}")
                                        for n in range(2)))
        assert outcomes(during) == {"success": 1, "RATE_LIMITED": 1}, outcomes(during)
        held.cancel()  # the caller goes away before its call ran: its place is given back soon after
        with pytest.raises(asyncio.CancelledError):
            await held
        await until(lambda: fewer_places(running, 2), timeout=30, what="the place of the abandoned call given back")
        after = await asyncio.gather(*(erin.execute("create_note", {"text": f"a {n}"}, idempotency_key=f"a-{n}")
                                       for n in range(2)))
        assert outcomes(after) == {"success": 1, "RATE_LIMITED": 1}, outcomes(after)
        assert tools.CREATED.value - before == 2
    finally:
        holding.release.set()



async def test_a_meter_that_sums_lets_through_exactly_what_fits_its_limit(serve: Serve, store_section: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    docs = await documents(tmp_path / "plugins")
    recipients = {"recipients": {"by": ["tenant"], "window_seconds": 3600, "tools": ["send_email_preview"],
                                 "sum": "/recipients", "limit": 5}}
    running = await serve(docs.registry, policies=with_meters(tmp_path / "policies", recipients), store=store_section)
    alice, bob = running.client("alice"), running.client("bob")  # one tenant: one sum
    pair = {**INSIDE, "recipients": [{"email": "ana@example.com"}, {"email": "ops@example.com"}]}
    results = await asyncio.gather(*(client.execute("send_email_preview", pair) for client in [alice, bob] * 10))
    # The first two to be counted see 0 and 2 recipients: both fit; every later one would pass 5.
    assert outcomes(results) == {"success": 2, "RATE_LIMITED": 18}, outcomes(results)
    for result in results:
        if result.error is not None:
            assert result.meta.attempt == 0 and result.error.details is not None
            retry = result.error.details[RETRY_AFTER_SECONDS]
            assert type(retry) is int and 1 <= retry <= 3600, retry
            assert result.error.message == (f"rate limit recipients reached: 5 per 3600 seconds; "
                                            f"retry in {retry} seconds")
    # One more recipient fits (4 + 1); then none does, whoever asks; other tools are not counted.
    assert code(await bob.execute("send_email_preview", INSIDE)) == "success"
    assert code(await alice.execute("send_email_preview", INSIDE)) == "RATE_LIMITED"
    assert code(await alice.execute("read_document", {"document_id": docs.plan})) == "success"


async def test_64_concurrent_retries_of_one_keyed_write_hold_one_place(serve: Serve, store_section: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(1)),
                          store=store_section)
    fay = running.client("fay")
    before = tools.CREATED.value
    results = await asyncio.gather(*(fay.execute("create_note", {"text": "once"}, idempotency_key="k-once")
                                     for _ in range(64)))
    # Duplicates of one write get its outcome (or are told it is in progress), never RATE_LIMITED.
    assert set(outcomes(results)) <= {"success", "OPERATION_IN_PROGRESS"}, outcomes(results)
    assert tools.CREATED.value - before == 1
    assert code(await fay.execute("create_note", {"text": "once"}, idempotency_key="k-once")) == "success"
    # It holds the one place: any other write is limited.
    assert_rate_limited(await fay.execute("create_note", {"text": "other"}, idempotency_key="k-other"), 1)
    assert tools.CREATED.value - before == 1


async def test_a_retry_that_ran_keeps_its_keys_place_when_the_call_that_took_it_does_not_run(
        serve: Serve, store_section: dict[str, Any], tmp_path: Path) -> None:
    holding = Holding()
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(2)),
                          store=store_section, stages=Stages(after_decisions=[holding]))
    gil = running.client("gil")
    before = tools.CREATED.value
    try:
        # The first call of key k takes the key's place on the meter, and is held before it claims the key.
        first = asyncio.create_task(gil.execute("create_note", {"text": "hold"}, idempotency_key="k"))
        await asyncio.wait_for(holding.arrived.wait(), 30)
        # Its retry finds the key's place taken (so takes none of its own), claims the key and runs.
        retry = await gil.execute("create_note", {"text": "hold"}, idempotency_key="k")
        assert code(retry) == "success" and not retry.meta.idempotency_replayed, retry
        assert tools.CREATED.value - before == 1
    finally:
        holding.release.set()
    # The first goes on, finds the key completed and is replayed: it did not run itself, but its key's write did.
    replayed = await first
    assert code(replayed) == "success" and replayed.meta.idempotency_replayed, replayed
    # So the key's write still holds one of the two places: of three more writes, one may run.
    more = await asyncio.gather(*(gil.execute("create_note", {"text": f"m {n}"}, idempotency_key=f"m-{n}")
                                  for n in range(3)))
    assert outcomes(more) == {"success": 1, "RATE_LIMITED": 2}, outcomes(more)
    assert tools.CREATED.value - before == 2  # the limit: two writes a minute


# --- 2. across two sidecar processes sharing PostgreSQL --------------------------------------------------------

KEYS = key_pair("RS256")
ISSUER, AUDIENCE = "https://issuer.example", "toolbooth"


def process_token(sub: str) -> str:
    claims = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300, "tenant": "acme",
              "roles": ["developer"]}
    return jwt.encode(claims, KEYS.private, algorithm="RS256")


def process_settings(tmp_path: Path, name: str, dsn: str, policies: Path) -> dict[str, Any]:
    return {
        "server": {"listen": [f"unix://{tmp_path / f'{name}.sock'}"], "shutdown_grace_seconds": 2},
        "auth": {"mode": "jwt", "jwt": {"algorithms": ["RS256"], "issuer": ISSUER, "audience": AUDIENCE,
                                        "key": KEYS.public, "leeway_seconds": 0}},
        "policy": {"path": str(policies), "reload_interval_seconds": 0},
        "store": {"postgres_dsn": dsn, "sqlite_path": str(tmp_path / f"{name}-unused.db")},
    }


async def test_two_sidecar_processes_sharing_postgres_let_exactly_five_of_64_writes_run(postgres_dsn: str,
                                                                                     tmp_path: Path) -> None:
    policies = with_meters(tmp_path / "policies", writes(5))
    log = tmp_path / "executions.log"
    started: list[SidecarProcess] = []
    clients: list[AsyncClient] = []
    try:
        for name in ("a", "b"):
            config = tmp_path / f"{name}.json"
            config.write_text(json.dumps(process_settings(tmp_path, name, postgres_dsn, policies)))
            started.append(SidecarProcess(config, tmp_path / f"{name}.sock", tmp_path / f"{name}.err", log))
        await asyncio.gather(*(sidecar.wait_serving() for sidecar in started))
        clients = [AsyncClient(sidecar.target, token=process_token("alice"), timeout=60) for sidecar in started]
        results = await asyncio.gather(*(client.execute("append_line", {"text": f"w-{n}"}, idempotency_key=f"w-{n}")
                                         for n, client in enumerate(clients * 32)))
        assert outcomes(results) == {"success": 5, "RATE_LIMITED": 59}, outcomes(results)
        lines = appended(log)
        assert len(lines) == 5, lines
        assert sorted(line.split()[1] for line in lines) == sorted(
            result.data["text"] for result in results if result.data is not None)
        for result in results:
            if result.status is not Status.SUCCESS:
                assert_rate_limited(result, 5)
        # Retries of the writes that ran, each through the other process, get their replay, not RATE_LIMITED.
        ran = [n for n, result in enumerate(results) if result.status is Status.SUCCESS]
        retries = await asyncio.gather(*(clients[(n + 1) % 2].execute("append_line", {"text": f"w-{n}"},
                                                                       idempotency_key=f"w-{n}") for n in ran))
        assert all(code(r) == "success" and r.meta.idempotency_replayed for r in retries), retries
        assert [r.data for r in retries] == [results[n].data for n in ran]
        assert len(appended(log)) == 5
    finally:
        await asyncio.gather(*(client.close() for client in clients))
        for name, sidecar in zip("ab", started, strict=False):
            exit_code = sidecar.stop()
            print(f"--- sidecar {name} (pid {sidecar.process.pid}) exited with {exit_code}:\n{sidecar.output()}")


# --- 3. RATE_LIMITED reaches every transport ------------------------------------------------------------------


async def test_rate_limited_reaches_every_transport_with_when_to_retry(serve: Serve, tmp_path: Path) -> None:
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(1)),
                          mcp={"listen": "127.0.0.1:0"}, http_json={"listen": "127.0.0.1:0"})
    mcp = McpEndpoint.open(running.settings, running.pipeline)
    http = HttpJsonEndpoint.open(running.settings, running.pipeline)
    await mcp.start()
    await http.start()
    try:
        # gRPC, unary: each principal's second write is limited.
        unary = running.client("unary")
        assert code(await unary.execute("create_note", {"text": "u"}, idempotency_key="u-1")) == "success"
        assert_rate_limited(await unary.execute("create_note", {"text": "u"}, idempotency_key="u-2"), 1)

        # ExecuteToolBatch: of two writes in one batch, one runs and one is limited.
        batch = await running.client("batch").execute_batch([
            call_request("create_note", {"text": "b"}, idempotency_key="b-1"),
            call_request("create_note", {"text": "b"}, idempotency_key="b-2")])
        assert outcomes(batch) == {"success": 1, "RATE_LIMITED": 1}, outcomes(batch)
        assert_rate_limited(next(r for r in batch if r.status is Status.ERROR), 1)

        # ExecuteToolStream: the limited call's one event is its result.
        streaming = running.client("stream")
        first = [event async for event in streaming.execute_stream("create_note", {"text": "s"},
                                                                      idempotency_key="s-1")]
        assert [code(event) for event in first if isinstance(event, ToolResult)] == ["success"]
        second = [event async for event in streaming.execute_stream("create_note", {"text": "s"},
                                                                       idempotency_key="s-2")]
        assert len(second) == 1 and isinstance(second[0], ToolResult), second
        assert_rate_limited(second[0], 1)

        # MCP: an error result (isError) whose structured content carries retry_after_seconds.
        async with http_session(mcp.url, running.token("mcp")) as session:
            ok = await session.call_tool("create_note", {"text": "m"}, meta={"toolbooth/idempotency_key": "m-1"})
            assert not ok.is_error and typed(ok.structured_content).status is Status.SUCCESS
            refused = await session.call_tool("create_note", {"text": "m"},
                                              meta={"toolbooth/idempotency_key": "m-2"})
        assert refused.is_error is True
        assert refused.structured_content is not None
        retry = assert_rate_limited(typed(refused.structured_content), 1)
        assert refused.structured_content["error"]["details"] == {RETRY_AFTER_SECONDS: retry}

        # HTTP/JSON: the limited call's answer carries Retry-After, its result's retry_after_seconds.
        async with http_client(running.token("http")) as web:
            done = await web.post(http.url, json={"tool": "create_note", "arguments": {"text": "h"},
                                                  "idempotency_key": "h-1"})
            limited = await web.post(http.url, json={"tool": "create_note", "arguments": {"text": "h"},
                                                     "idempotency_key": "h-2"})
        assert done.status_code == 200 and "Retry-After" not in done.headers, done.headers
        assert ToolResult.model_validate(done.json()).status is Status.SUCCESS
        assert limited.status_code == 200, limited.text
        retry = assert_rate_limited(ToolResult.model_validate(limited.json()), 1)
        assert limited.headers["Retry-After"] == str(retry)
    finally:
        await http.stop()
        await mcp.stop()


# --- 4. the loop breaker --------------------------------------------------------------------------------------


async def test_the_fourth_identical_failing_call_of_a_conversation_is_refused(serve: Serve,
                                                                              store_section: dict[str, Any]) -> None:
    running = await serve(basic_registry(), store=store_section)
    agent = running.client("alice")
    before = MISSES.value
    for attempt in range(3):
        failed = await agent.execute("lookup_record", {"name": "x-1"}, conversation_id="c-1")
        assert failed.error is not None and failed.error.code is ErrorCode.RESOURCE_NOT_FOUND, (attempt, failed)
        assert failed.error.message == "there is no record 'x-1'" and failed.meta.attempt == 1
    assert MISSES.value - before == 3
    fourth = await agent.execute("lookup_record", {"name": "x-1"}, conversation_id="c-1")
    assert fourth.error is not None and fourth.error.code is ErrorCode.POLICY_VIOLATION, fourth
    assert fourth.error.message == LOOP and fourth.meta.attempt == 0
    assert (fourth.error.retryable, fourth.error.recovery) == (False, Recovery.REQUEST_USER_INPUT)
    assert MISSES.value - before == 3  # refused before it ran
    # The same arguments in another key order are the same call.
    fifth = await agent.execute("lookup_record", '{ "name" : "x-1" }', conversation_id="c-1")
    assert code(fifth) == "POLICY_VIOLATION" and MISSES.value - before == 3
    # The same call in another conversation, or another principal's conversation of the same id, runs.
    elsewhere = await agent.execute("lookup_record", {"name": "x-1"}, conversation_id="c-2")
    assert code(elsewhere) == "RESOURCE_NOT_FOUND" and MISSES.value - before == 4
    someone = await running.client("bob").execute("lookup_record", {"name": "x-1"}, conversation_id="c-1")
    assert code(someone) == "RESOURCE_NOT_FOUND" and MISSES.value - before == 5
    # Other arguments in the same conversation are another call, which runs.
    other = await agent.execute("lookup_record", {"name": "x-2"}, conversation_id="c-1")
    assert code(other) == "RESOURCE_NOT_FOUND" and MISSES.value - before == 6


async def test_a_write_retried_with_new_keys_is_a_loop_too(serve: Serve, store_section: dict[str, Any]) -> None:
    running = await serve(basic_registry(), store=store_section)
    agent = running.client("alice")
    before = FILED.value
    results = [await agent.execute("file_record", {"name": "x"}, idempotency_key=f"f-{n}", conversation_id="c-1")
               for n in range(4)]
    assert [code(result) for result in results] == ["RESOURCE_NOT_FOUND"] * 3 + ["POLICY_VIOLATION"], results
    assert results[3].error is not None and results[3].error.message == LOOP
    assert FILED.value - before == 3
    # Even a retry with the key of one of the failed calls is refused: the policies decide before the key is read.
    again = await agent.execute("file_record", {"name": "x"}, idempotency_key="f-0", conversation_id="c-1")
    assert code(again) == "POLICY_VIOLATION" and FILED.value - before == 3


# --- 5. the exfiltration rule ---------------------------------------------------------------------------------


async def test_a_conversation_that_read_restricted_data_may_not_mail_it_outside(serve: Serve,
                                                                                store_section: dict[str, Any],
                                                                                tmp_path: Path) -> None:
    docs = await documents(tmp_path / "plugins")
    running = await serve(docs.registry, store=store_section)
    agent = running.client("alice", permissions=EXTERNAL_READER)

    found = await agent.execute("search_documents", {"query": "launch"}, conversation_id="c-1")
    assert found.status is Status.SUCCESS and found.data is not None, found
    assert {item["document_id"]: item["restricted"] for item in found.data["items"]} == {docs.plan: False,
                                                                                         docs.budget: True}
    read = await agent.execute("read_document", {"document_id": docs.budget}, conversation_id="c-1")
    assert read.status is Status.SUCCESS and read.data is not None and "12345" in read.data["content"], read

    refused = await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-1")
    assert refused.error is not None and refused.error.code is ErrorCode.POLICY_VIOLATION, refused
    assert refused.error.message == EXFILTRATION and refused.meta.attempt == 0
    # Several recipients outside: named once each; one inside among them does not help.
    mixed = {**OUTSIDE, "cc": [{"email": "ana@example.com"}, {"email": "cy@elsewhere.net"}]}
    refused = await agent.execute("send_email_preview", mixed, conversation_id="c-1")
    assert refused.error is not None and refused.error.code is ErrorCode.POLICY_VIOLATION
    assert refused.error.message.endswith("outside the organization (elsewhere.net, partner.org)")

    # Mail inside the organization is still fine in that conversation; sending it needs approval, whose reason
    # ends with the conversation's labels.
    inside = await agent.execute("send_email_preview", INSIDE, conversation_id="c-1")
    assert inside.status is Status.SUCCESS and inside.data is not None, inside
    held = await agent.execute("send_email", {"preview_id": inside.data["preview_id"]}, idempotency_key="send-1",
                               conversation_id="c-1")
    assert held.status is Status.APPROVAL_REQUIRED and held.preview is not None, held
    assert held.preview.reason == ("the tool's effects are external and irreversible; "
                                   "conversation labels: restricted (read_document)")

    # Without the restricted read (c-2), or having read only an open document (c-3), the same preview is made.
    clean = await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-2")
    assert clean.status is Status.SUCCESS and clean.data is not None, clean
    assert [warning["code"] for warning in clean.data["warnings"]] == ["EXTERNAL_RECIPIENT"]
    opened = await agent.execute("read_document", {"document_id": docs.plan}, conversation_id="c-3")
    assert opened.status is Status.SUCCESS, opened
    after_open = await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-3")
    assert after_open.status is Status.SUCCESS, after_open
    assert after_open.data is not None
    unlabelled = await agent.execute("send_email", {"preview_id": after_open.data["preview_id"]},
                                     idempotency_key="send-3", conversation_id="c-3")
    assert unlabelled.preview is not None and unlabelled.preview.reason == (
        "the tool's effects are external and irreversible")
    # The conversation is the principal's: another's c-1 carries no label.
    other = running.client("carol", permissions=EXTERNAL_READER)
    assert code(await other.execute("send_email_preview", OUTSIDE, conversation_id="c-1")) == "success"


# --- 6. labels survive a restart ------------------------------------------------------------------------------


async def test_labels_outlast_a_restart_of_the_sidecar(serve: Serve, store_section: dict[str, Any],
                                                       tmp_path: Path) -> None:
    docs = await documents(tmp_path / "plugins")
    first = await serve(docs.registry, store=store_section)
    agent = first.client("alice", permissions=EXTERNAL_READER)
    read = await agent.execute("read_document", {"document_id": docs.budget}, conversation_id="c-1")
    assert read.status is Status.SUCCESS, read
    await first.stop()

    second = await serve(docs.registry, store=store_section)
    agent = second.client("alice", permissions=EXTERNAL_READER)
    refused = await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-1")
    assert refused.error is not None and refused.error.code is ErrorCode.POLICY_VIOLATION, refused
    assert refused.error.message == EXFILTRATION
    assert code(await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-2")) == "success"


# --- 7. fail closed -------------------------------------------------------------------------------------------


def drop_history(store: dict[str, Any]) -> None:
    """Drop the history table from a connection of its own, as someone with database access could."""
    if "postgres_dsn" in store:
        with psycopg.connect(store["postgres_dsn"], autocommit=True) as conn:
            conn.execute("DROP TABLE toolbooth_history")
        return
    conn = sqlite3.connect(store["sqlite_path"], timeout=30)
    try:
        conn.execute("DROP TABLE toolbooth_history")
        conn.commit()
    finally:
        conn.close()


async def test_a_store_that_cannot_answer_the_history_refuses_the_call(serve: Serve, store_section: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    running = await serve(basic_registry(), policies=with_meters(tmp_path / "policies", writes(5)),
                          store=store_section)
    agent = running.client("alice")
    assert code(await agent.execute("counted_read", {"text": "before"}, conversation_id="c-1")) == "success"
    reads, created = READS.value, tools.CREATED.value
    drop_history(store_section)

    for name, arguments, key in (("counted_read", {"text": "after"}, None),  # reads the conversation's labels
                                 ("create_note", {"text": "after"}, "k-after")):  # and counts a meter too
        result = await agent.execute(name, arguments, idempotency_key=key, conversation_id="c-1")
        assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE, result
        assert result.error.message == "the call history is unavailable; nothing was executed"
        assert (result.error.retryable, result.error.recovery) == (True, Recovery.RETRY_WITH_BACKOFF)
        assert result.meta.attempt == 0
    assert (READS.value, tools.CREATED.value) == (reads, created)
    listing = await agent.list_tools(conversation_id="c-1")  # availability reads no history
    assert {"counted_read", "create_note"} <= {descriptor.name for descriptor in listing.tools}


async def test_a_read_whose_labels_cannot_be_recorded_is_not_given(serve: Serve, store_section: dict[str, Any]) -> None:
    running = await serve(basic_registry(), store=store_section)
    agent = running.client("alice")
    before = SECRET_READS.value
    WHILE_READING.append(lambda: drop_history(store_section))  # after its history was read, before it is recorded
    try:
        result = await agent.execute("secret_read", {"text": "the-secret-text"}, conversation_id="c-1")
    finally:
        WHILE_READING.clear()
    assert SECRET_READS.value - before == 1
    assert result.error is not None and result.error.code is ErrorCode.SERVICE_UNAVAILABLE, result
    assert result.error.message == ("the call history is unavailable; the result is not given, as its labels could "
                                    "not be recorded")
    assert result.data is None and "the-secret-text" not in result.model_dump_json()


# --- 8. replay decides on the history each call saw ------------------------------------------------------------


def edited(policies: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``policies`` with ``edit`` applied to its data (``data.toolbooth``)."""
    shutil.copytree(policies, target)
    data = json.loads((target / "data.json").read_text())
    edit(data["toolbooth"])
    (target / "data.json").write_text(json.dumps(data))
    return target


def replay(capsys: pytest.CaptureFixture[str], config: Path, policies: Path, *flags: str) -> tuple[int, Any]:
    exit_code = main(["policy", "replay", "--config", str(config), "--policies", str(policies), "--json", *flags])
    return exit_code, json.loads(capsys.readouterr().out)


def changed(report: dict[str, Any]) -> Counter[tuple[str, str, str]]:
    """The changes of a report: how many of each (tool, before, after)."""
    return Counter((change["tool"], change["before"], change["after"]) for change in report["changes"])


async def test_replay_decides_again_on_the_history_each_call_saw(serve: Serve, store_section: dict[str, Any],
                                                                 tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    docs = await documents(tmp_path / "plugins")
    policies = with_meters(tmp_path / "policies", writes(2))
    running = await serve(docs.registry, policies=policies, store=store_section)
    agent = running.client("alice", permissions=EXTERNAL_READER)
    notes = [await agent.execute("create_note", {"text": f"n {n}"}, idempotency_key=f"n-{n}") for n in range(4)]
    assert [code(result) for result in notes] == ["success", "success", "RATE_LIMITED", "RATE_LIMITED"]
    loops = [await agent.execute("lookup_record", {"name": "x"}, conversation_id="c-loop") for _ in range(4)]
    assert [code(result) for result in loops] == ["RESOURCE_NOT_FOUND"] * 3 + ["POLICY_VIOLATION"]
    assert code(await agent.execute("read_document", {"document_id": docs.budget}, conversation_id="c-1")) == "success"
    assert code(await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-1")) == "POLICY_VIOLATION"
    assert code(await agent.execute("send_email_preview", OUTSIDE, conversation_id="c-2")) == "success"
    await running.stop()  # every audit event written
    config = tmp_path / "replay.json"
    config.write_text(json.dumps({"store": store_section}))

    # The same policies: nothing changes, and every call was replayed, the refused ones too.
    exit_code, report = await asyncio.to_thread(replay, capsys, config, policies)
    assert (exit_code, report["changes"]) == (0, []), report
    for name, replayed, skipped in (("create_note", 4, {"same_call": 2}), ("lookup_record", 4, {}),
                                    ("send_email_preview", 2, {}), ("read_document", 1, {})):
        exit_code, report = await asyncio.to_thread(replay, capsys, config, policies, "--tool", name)
        assert (exit_code, report["replayed"], report["skipped"], report["changes"]) == (0, replayed, skipped, []), (
            name, report)

    # Candidates that differ on what the history decided: each changes exactly the calls it decided, because
    # each call is decided on the history it saw then (counts, failures, labels), not on the history of now.
    # (Both limited writes saw two calls counted: the first gave its place back once refused.)
    roomier = edited(policies, tmp_path / "roomier", lambda data: data["history"]["meters"]["writes"].update(limit=3))
    exit_code, report = await asyncio.to_thread(replay, capsys, config, roomier)
    assert exit_code == 3 and changed(report) == {("create_note", "denied", "would_run"): 2}, report
    patient = edited(policies, tmp_path / "patient", lambda data: data["history"].update(loop_after_failures=4))
    exit_code, report = await asyncio.to_thread(replay, capsys, config, patient)
    assert exit_code == 3 and changed(report) == {("lookup_record", "denied", "would_run"): 1}, report
    trusting = edited(policies, tmp_path / "trusting", lambda data: data["email"].update(no_external_after_labels=[]))
    exit_code, report = await asyncio.to_thread(replay, capsys, config, trusting)
    assert exit_code == 3 and changed(report) == {("send_email_preview", "denied", "would_run"): 1}, report


async def test_replay_does_not_call_a_call_refused_for_want_of_its_history_cancelled(
        serve: Serve, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = {"sqlite_path": str(tmp_path / "toolbooth.db")}
    running = await serve(basic_registry(), store=store)
    agent = running.client("alice")
    assert code(await agent.execute("counted_read", {"text": "before"}, conversation_id="c-1")) == "success"
    drop_history(store)
    refused = await agent.execute("counted_read", {"text": "after"}, conversation_id="c-1")
    assert code(refused) == "SERVICE_UNAVAILABLE" and refused.meta.attempt == 0
    await running.stop()
    config = tmp_path / "replay.json"
    config.write_text(json.dumps({"store": store}))
    exit_code, report = await asyncio.to_thread(replay, capsys, config, bundled_policy_dir(), "--tool",
                                                "counted_read")
    assert (exit_code, report["replayed"], report["changes"]) == (0, 1, []), report
    # The refused call cannot be replayed (what its decisions would have read is not known), and is skipped; but
    # it was not "cancelled before its decisions were made": nobody cancelled it, its history could not be read.
    assert sum(report["skipped"].values()) == 1, report
    assert "incomplete" not in report["skipped"], report


@tool(name="fetch_secret", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=5,
      labels=("restricted",))
async def fetch_secret(args: Text, ctx: ToolContext) -> Text:
    """A write whose result is restricted data."""
    ctx.add_label("restricted")
    return Text(text="SECRET 12345")


async def test_a_labelled_result_replayed_in_another_conversation_labels_that_conversation(
        serve: Serve, tmp_path: Path) -> None:
    docs = await documents(tmp_path / "plugins")
    running = await serve(Registry.from_tools([*docs.registry, fetch_secret]))
    agent = running.client("alice", permissions=EXTERNAL_READER)
    first = await agent.execute("fetch_secret", {"text": "x"}, idempotency_key="k1", conversation_id="A")
    again = await agent.execute("fetch_secret", {"text": "x"}, idempotency_key="k1", conversation_id="B")
    assert code(first) == code(again) == "success" and again.meta.idempotency_replayed and again.data is not None
    leak = await agent.execute("send_email_preview", {**OUTSIDE, "body_text": again.data["text"]},
                               conversation_id="B")
    assert leak.error is not None and leak.error.code is ErrorCode.POLICY_VIOLATION, leak
    assert '"restricted" (from fetch_secret)' in leak.error.message
