"""A hostile or broken OPA server, through a real sidecar with ``policy.engine: opa``.

Whatever OPA does — it is down, slow, answers 5xx, a malformed decision, a redirect to a
server that allows everything, JSON nested to blow a recursive parser, or a body of many
megabytes — the call fails closed: nothing runs, the caller gets a typed result within the
engine's timeout (+ 50 ms, one call in flight), and the call is audited. Redirects are never
followed, so a redirect's target never sees the input. The faults the pipeline-level suite
(``tests/integration/test_policy_engines.py``) also checks are here through the server, with
the audit event and the tighter bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.bootstrap import serve
from sidecar.client import AsyncClient
from sidecar.config import Settings
from sidecar.contract import ErrorCode, Status
from sidecar.errors import PolicyLoadError
from sidecar.policy.opa import MAX_ANSWER_BYTES, MAX_ANSWER_DEPTH
from sidecar.state import AuditRecord
from sidecar.state.sqlite import SqliteStore
from sidecar.tools.registry import Registry
from tests.integration.test_policy_engines import AUTHZ_PATH, TIMEOUT, nothing_listening
from tests.support import tools
from tests.support.opa_server import ALLOW, Fault, OpaServer, deep_json, huge_json
from tests.support.waiting import until

pytestmark = pytest.mark.integration

# What a failing call may take, end to end, with one call in flight: the engine's timeout and the call's own
# work, which a loaded machine stretches (0.32 s seen at a load of 10 on 2 cores), far below any fault's own
# duration (a slow OPA answers after 10 timeouts), so a call that waited for the fault still fails the test.
BOUND = 2 * TIMEOUT
ELSEWHERE = "elsewhere"  # in a Fault's redirect: replaced by the other server's URL


@dataclass(frozen=True)
class Case:
    """One way for OPA to fail a decision, and the error code the call must then get."""

    fault: Fault | None = None
    code: ErrorCode = ErrorCode.SERVICE_UNAVAILABLE
    down: bool = False  # nothing listens at the OPA url


def redirect(status: int) -> Case:
    return Case(Fault(status=status, redirect=ELSEWHERE, path=AUTHZ_PATH))


CASES = {
    "down": Case(down=True),
    "slow": Case(Fault(latency=10 * TIMEOUT, path=AUTHZ_PATH)),
    "HTTP 500": Case(Fault(status=500, path=AUTHZ_PATH)),
    "HTTP 503": Case(Fault(status=503, path=AUTHZ_PATH)),
    "malformed decision": Case(Fault(body=b'{"result": {"allow": "yes"}}', path=AUTHZ_PATH), ErrorCode.INTERNAL_ERROR),
    **{f"redirect {status}": redirect(status) for status in (302, 303, 307, 308)},
    "nested past the recursion limit": Case(Fault(body=deep_json(100_000), path=AUTHZ_PATH)),
    "nested past the depth limit": Case(Fault(body=deep_json(MAX_ANSWER_DEPTH + 1), path=AUTHZ_PATH)),
    "just over the size limit": Case(Fault(body=huge_json(MAX_ANSWER_BYTES + 1), path=AUTHZ_PATH)),
    "huge body": Case(Fault(body=huge_json(16 * MAX_ANSWER_BYTES), path=AUTHZ_PATH)),
}


@pytest.fixture
def opa() -> Iterator[OpaServer]:
    with OpaServer() as server:
        yield server


@pytest.fixture
def elsewhere() -> Iterator[OpaServer]:
    """Another server, allowing every decision: where hostile redirects point."""
    with OpaServer() as server:
        server.inject(Fault(body=ALLOW))
        yield server


def opa_policy(url: str, **opa: Any) -> dict[str, Any]:
    return {"engine": "opa", "opa": {"url": url, "timeout_seconds": TIMEOUT, **opa}}


async def audited(db: Path, key: str) -> AuditRecord:
    """The audit record of the call with idempotency ``key``, once the sidecar has written it."""
    store = await SqliteStore.open(db)
    try:
        async def written() -> list[AuditRecord]:
            return [r for r in await store.audit_records() if r.event.idempotency_key == key]

        await until(written, timeout=5, what=f"the audit record of {key}")
        [record, *_] = await written()
    finally:
        await store.aclose()
    return record


@pytest.mark.parametrize("name", list(CASES))
async def test_a_failing_opa_fails_the_call_closed_in_time_and_audited(
        serve_in_background: Any, opa: OpaServer, elsewhere: OpaServer, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    url = nothing_listening() if case.down else opa.url
    target = await serve_in_background(policy=opa_policy(url, upload_policies=not case.down))
    async with AsyncClient(target, timeout=5) as client:
        await client.execute("echo", {"text": "warm up"})  # the channel is connected before the clock starts
        fault = case.fault
        if fault is not None and fault.redirect == ELSEWHERE:
            fault = Fault(status=fault.status, redirect=elsewhere.url, path=fault.path)
        opa.inject(fault)
        asked, before, started = len(opa.seen), tools.CREATED.value, time.monotonic()
        result = await client.execute("create_note", {"text": name}, idempotency_key=f"fault-{name}")
        elapsed = time.monotonic() - started
    assert result.status is Status.ERROR and result.error is not None, result
    assert result.error.code is case.code, result.error
    assert tools.CREATED.value == before
    assert elapsed < BOUND, elapsed
    assert case.down or any(seen.path.startswith(AUTHZ_PATH) for seen in opa.seen[asked:])  # the fault was met
    assert elsewhere.seen == []  # a redirect is not followed: its target never sees the input
    record = await audited(tmp_path / "toolbooth.db", f"fault-{name}")
    assert (record.event.status, record.event.error_code) == (Status.ERROR.value, case.code.value)


async def test_a_redirected_policy_upload_stops_the_start(make_settings: Callable[..., Settings], opa: OpaServer,
                                                           elsewhere: OpaServer) -> None:
    opa.inject(Fault(status=307, redirect=elsewhere.url, path="/v1/policies"))
    settings = make_settings(policy=opa_policy(opa.url))
    with pytest.raises(PolicyLoadError, match=r"cannot upload policies to OPA .*HTTP 307.*not followed"):
        await serve(settings, registry=Registry.from_tools(tools.ALL), stop=asyncio.Event())
    assert elsewhere.seen == []


async def test_a_redirected_status_request_is_not_followed(serve_in_background: Any, opa: OpaServer,
                                                           elsewhere: OpaServer) -> None:
    elsewhere.inject(Fault(body=b'{"result": {"main": {"manifest": {"revision": "forged"}}}}'))
    opa.inject(Fault(status=308, redirect=elsewhere.url, path="/v1/data/system/bundles"))
    target = await serve_in_background(policy=opa_policy(opa.url, upload_policies=False))
    async with AsyncClient(target, timeout=5) as client:
        assert (await client.policy_status()).revision == f"opa:{opa.url}"
    assert elsewhere.seen == []
