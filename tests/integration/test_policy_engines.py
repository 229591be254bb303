"""Both policy engines through the real pipeline: decisions, failing closed, and the same answers.

Each test that can run on either engine runs on both: ``embedded`` (regorus) and
``opa`` against a local OPA server. That server is ``tests.support.opa_server.OpaServer``
— evaluating with OPA's own engine — or, when ``TOOLBOOTH_TEST_OPA_URL`` is set, the
same server in front of that OPA server, forwarding every request to it (the policies
are uploaded there) and only adding the transport faults a real server cannot be asked
for. The failures that only a remote engine can have (unreachable, slow, HTTP 500,
dropped connection, an answer that is not OPA's) run on ``opa`` only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import PolicyEngineKind, PolicySettings, bundled_policy_dir
from sidecar.contract import CallRequest, ErrorCode, Principal, Status
from sidecar.errors import PolicyEvaluationError, PolicyLoadError
from sidecar.policy import CALL_STAGES, PolicyEngine, Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.engines import open_engine
from sidecar.policy.input import CallInput, InputParts, PolicyInput, principal_json, tool_json
from tests.conftest import ADMIN, DEVELOPER, PipelineFactory
from tests.support import tools
from tests.support.opa_server import Fault, OpaServer

pytestmark = pytest.mark.integration

TIMEOUT = 0.25  # policy.opa.timeout_seconds in these tests
MARGIN = 0.25  # what a failing call may take beyond it
AUTHZ_PATH = "/v1/data/toolbooth/authz"

OpenEngine = Callable[..., Awaitable[PolicyEngine]]


@pytest.fixture
def opa() -> Iterator[OpaServer]:
    """The OPA server of the opa engine: a local one, or one forwarding to ``$TOOLBOOTH_TEST_OPA_URL``."""
    with OpaServer(upstream=os.environ.get("TOOLBOOTH_TEST_OPA_URL")) as server:
        yield server


@pytest.fixture(params=list(PolicyEngineKind))
def engine_kind(request: pytest.FixtureRequest) -> PolicyEngineKind:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def open_policy(engine_kind: PolicyEngineKind, opa: OpaServer) -> AsyncIterator[OpenEngine]:
    """``await open_policy(path, **opa_settings)``: the engine under test over ``path``, as configured."""
    opened: list[PolicyEngine] = []

    async def open_(path: Path | None = None, **opa_settings: Any) -> PolicyEngine:
        engine = await open_engine(settings(engine_kind, opa, path, **opa_settings))
        opened.append(engine)
        return engine

    yield open_
    for engine in opened:
        await engine.aclose()


def settings(kind: PolicyEngineKind, opa: OpaServer, path: Path | None = None, **opa_settings: Any) -> PolicySettings:
    return PolicySettings.model_validate({
        "engine": kind, "path": path or bundled_policy_dir(),
        "opa": {"url": opa.url, "timeout_seconds": TIMEOUT, **opa_settings},
    })


def policies_with_authz(root: Path, body: str) -> Path:
    """A copy of the default policies whose authz module is ``body``."""
    path = Path(shutil.copytree(bundled_policy_dir(), root / "policies"))
    (path / "authz.rego").write_text(f"package toolbooth.authz\n\nimport rego.v1\n\n{body}\n")
    return path


def nothing_listening() -> str:
    """A loopback URL whose port was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def request(tool: str, key: str | None = None, **arguments: Any) -> CallRequest:
    return CallRequest(tool=tool, arguments_json=json.dumps(arguments), idempotency_key=key)


DECISIONS = {
    # name: (principal, request, (status, error code))
    "read tool": (DEVELOPER, request("echo", text="hi"), (Status.SUCCESS, None)),
    "write tool": (DEVELOPER, request("create_note", "note-1", text="x"), (Status.SUCCESS, None)),
    "hidden tool": (DEVELOPER, request("admin_console", text="x"), (Status.ERROR, ErrorCode.TOOL_UNAVAILABLE)),
    "hidden tool, admin": (ADMIN, request("admin_console", text="x"), (Status.SUCCESS, None)),
    "missing permission": (DEVELOPER, request("delete_records", text="x"), (Status.ERROR, ErrorCode.PERMISSION_DENIED)),
    "irreversible": (DEVELOPER, request("send_email", "mail-1", text="x"),
                     (Status.APPROVAL_REQUIRED, ErrorCode.APPROVAL_REQUIRED)),
}


@pytest.mark.parametrize("name", list(DECISIONS))
async def test_default_policies_decide(open_policy: OpenEngine, make_pipeline: PipelineFactory, name: str,
                                      bundled_policies: Path) -> None:
    principal, call, expected = DECISIONS[name]
    pipeline = await make_pipeline(policy=await open_policy(bundled_policies))
    result = await pipeline.execute(principal, call)
    assert (result.status, result.error.code if result.error else None) == expected, result.error
    assert result.meta.policy_revision == EmbeddedEngine.load(bundled_policies).revision


async def test_listing_is_decided_per_role(open_policy: OpenEngine, make_pipeline: PipelineFactory) -> None:
    pipeline = await make_pipeline(policy=await open_policy())
    developer, admin = [{t.name for t in (await pipeline.list_tools(p)).tools} for p in (DEVELOPER, ADMIN)]
    assert admin - developer == {"admin_console"}
    assert developer == {d.name for d in tools.ALL} - {"admin_console"}


async def test_a_broken_policy_is_refused_at_start_naming_the_file(open_policy: OpenEngine, tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match=r"authz\.rego"):
        await open_policy(policies_with_authz(tmp_path, 'decision := {"allow": '))


@dataclass(frozen=True)
class Breakage:
    """One way for a decision to fail, and the result every engine must then give."""

    code: ErrorCode
    retryable: bool
    authz: str | None = None  # the authz policy has this bug
    fault: Fault | None = None  # the OPA server misbehaves this way
    unreachable: bool = False  # nothing listens at the OPA url

    @property
    def engines(self) -> tuple[PolicyEngineKind, ...]:
        return tuple(PolicyEngineKind) if self.authz else (PolicyEngineKind.OPA,)


UNAVAILABLE = {"code": ErrorCode.SERVICE_UNAVAILABLE, "retryable": True}
BREAKAGES = {
    "unreachable": Breakage(**UNAVAILABLE, unreachable=True),
    "slow": Breakage(**UNAVAILABLE, fault=Fault(latency=10 * TIMEOUT, path=AUTHZ_PATH)),
    "HTTP 500": Breakage(**UNAVAILABLE, fault=Fault(status=500, path=AUTHZ_PATH)),
    "connection dropped": Breakage(**UNAVAILABLE, fault=Fault(close=True, path=AUTHZ_PATH)),
    "not OPA's answer": Breakage(**UNAVAILABLE, fault=Fault(body=b"<html>gateway</html>", path=AUTHZ_PATH)),
    "malformed decision": Breakage(ErrorCode.INTERNAL_ERROR, retryable=False, authz='decision := {"allow": "yes"}'),
    "runtime error": Breakage(**UNAVAILABLE, authz=(  # two complete rules, two values: a conflict, in OPA and regorus
        'decision := {"allow": true} if input.principal.id\ndecision := {"allow": false} if input.principal.id')),
    "built-in error": Breakage(**UNAVAILABLE, authz='decision := {"allow": to_number(input.principal.id) > 0}'),
}


@pytest.mark.parametrize(("engine_kind", "name"), [
    pytest.param(kind, name, id=f"{kind}-{name}") for name, case in BREAKAGES.items() for kind in case.engines
])
async def test_failures_fail_closed_and_nothing_runs(open_policy: OpenEngine, make_pipeline: PipelineFactory,
                                                     opa: OpaServer, tmp_path: Path, name: str) -> None:
    case = BREAKAGES[name]
    path = policies_with_authz(tmp_path, case.authz) if case.authz else None
    reach = {"url": nothing_listening(), "upload_policies": False} if case.unreachable else {}
    pipeline = await make_pipeline(policy=await open_policy(path, **reach))
    opa.inject(case.fault)
    before, started = tools.CREATED.value, time.monotonic()
    result = await pipeline.execute(DEVELOPER, request("create_note", f"closed-{name}", text="x"))
    elapsed = time.monotonic() - started
    assert result.status is Status.ERROR and result.error is not None
    assert (result.error.code, result.error.retryable) == (case.code, case.retryable)
    assert tools.CREATED.value == before
    assert elapsed < TIMEOUT + MARGIN, elapsed


async def test_a_slow_opa_fails_a_listing_within_one_timeout(make_pipeline: PipelineFactory, opa: OpaServer) -> None:
    engine = await open_engine(settings(PolicyEngineKind.OPA, opa))
    pipeline = await make_pipeline(policy=engine)
    opa.inject(Fault(latency=10 * TIMEOUT))
    started = time.monotonic()
    with pytest.raises(PolicyEvaluationError):
        await pipeline.list_tools(DEVELOPER)
    assert TIMEOUT <= time.monotonic() - started < TIMEOUT + MARGIN  # all tools at once, not one after another


PRINCIPALS = [
    DEVELOPER,
    ADMIN,
    Principal(id="reader-1", tenant="acme", roles=("reader",)),
    Principal(id="ops-1", tenant="globex", roles=("reader",), permissions=("records:delete", "email:send")),
    Principal(id="nobody", tenant=""),
    Principal(id="multi", tenant="acme", roles=("reader", "developer", "unknown-role")),
]
ARGUMENTS = [{}, {"text": "hello"}, {"count": 3}, {"tenant": "globex", "payload": {"nested": [1, "two", None]}}]
CONVERSATIONS = [None, "conv-1"]


def corpus() -> dict[Stage, list[PolicyInput]]:
    """Every stage's inputs for principals x test tools x arguments x conversations, as the pipeline builds them."""
    inputs: dict[Stage, list[PolicyInput]] = {stage: [] for stage in CALL_STAGES}
    inputs[Stage.APPROVER] = [approver_input(principal, requested_by) for principal in PRINCIPALS
                              for requested_by in (DEVELOPER, ADMIN)]
    for principal in PRINCIPALS:
        for defn in tools.ALL:
            for conversation in CONVERSATIONS:
                parts = InputParts(principal_json(principal), tool_json(defn), "2026-11-30T15:00:00Z", conversation)
                inputs[Stage.AVAILABILITY].append(parts.build(Stage.AVAILABILITY))
                for arguments in ARGUMENTS:
                    call = CallInput.of(arguments, CallRequest(tool=defn.name, conversation_id=conversation,
                                                            idempotency_key="k-1"))
                    inputs[Stage.AUTHZ].append(parts.build(Stage.AUTHZ, call))
                    inputs[Stage.APPROVAL].append(parts.build(Stage.APPROVAL, call))
    return inputs


def approver_input(approver: Principal, requested_by: Principal) -> PolicyInput:
    """``data.toolbooth.approval.approver``'s input, as ``sidecar.pipeline.approvals`` builds it."""
    preview = {"preview_id": "p-1", "tool": "send_email", "tool_version": "1.0.0", "reason": "r",
               "requested_by": {"id": requested_by.id, "tenant": requested_by.tenant},
               "approver_roles": ["approver", "reader"]}
    return PolicyInput.of({"principal": approver.model_dump(mode="json"), "preview": preview,
                           "context": {"stage": "approver", "time": "2026-11-30T15:00:00Z"}})


async def test_both_engines_decide_the_same(opa: OpaServer) -> None:
    embedded = await open_engine(settings(PolicyEngineKind.EMBEDDED, opa))
    remote = await open_engine(settings(PolicyEngineKind.OPA, opa, timeout_seconds=5))
    try:
        for stage, inputs in corpus().items():
            expected = await embedded.decide_many(stage, inputs)
            assert await remote.decide_many(stage, inputs) == expected, stage
            assert len(set(expected)) > 1, f"the {stage} corpus must get different decisions"
    finally:
        await remote.aclose()
    assert remote.revision == embedded.revision
