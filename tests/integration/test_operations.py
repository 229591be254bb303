"""``GetOperation`` through a real server: each state, looked up by key or request id, for its caller only."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sidecar.bootstrap import open_pipeline
from sidecar.client import AsyncClient, ClientError
from sidecar.config import Settings
from sidecar.contract import ErrorCode, ErrorInfo, OperationState, ResultMeta, Status, ToolResult
from sidecar.pipeline import Pipeline
from sidecar.state import DEADLINE_GRACE_SECONDS, KeyScope
from sidecar.tools.registry import Registry
from tests.support import tools

pytestmark = pytest.mark.integration


@pytest.fixture
async def pipeline(make_settings: Callable[..., Settings], jwt_auth: dict[str, Any]) -> AsyncIterator[Pipeline]:
    built = await open_pipeline(make_settings(auth=jwt_auth), registry=Registry.from_tools(tools.ALL))
    yield built
    await built.aclose()


@pytest.fixture
async def client(make_settings, jwt_auth, start_sidecar, pipeline, make_token) -> AsyncIterator[AsyncClient]:
    sidecar = await start_sidecar(make_settings(auth=jwt_auth), pipeline)
    async with AsyncClient(sidecar.addresses[-1], token=make_token(sub="user-1"), timeout=5) as made:
        yield made


def scope(key: str, principal: str = "user-1") -> KeyScope:
    return KeyScope("acme", principal, "create_note", key)


async def test_a_completed_call_by_key_and_by_request_id(client: AsyncClient) -> None:
    result = await client.execute("create_note", {"text": "x"}, idempotency_key="k1")
    assert result.status is Status.SUCCESS
    for found in (await client.get_operation("create_note", "k1"),
                  await client.get_operation(request_id=result.meta.request_id)):
        assert found.state is OperationState.COMPLETED and found.result == result


async def test_in_progress_unknown_and_failed(client: AsyncClient, pipeline: Pipeline) -> None:
    await pipeline.store.claim(scope("running"), "h", "r1", deadline_at=time.time() + 60)
    await pipeline.store.claim(scope("lost"), "h", "r2", deadline_at=time.time() - DEADLINE_GRACE_SECONDS - 1)
    await pipeline.store.claim(scope("failed"), "h", "r3", deadline_at=time.time() + 60)
    error = ErrorInfo.of(ErrorCode.RESOURCE_NOT_FOUND, "no such note")
    stored = ToolResult(status=Status.ERROR, error=error, errors=(error,), meta=ResultMeta(request_id="r3",
                                                                                    tool="create_note"))
    await pipeline.store.complete(scope("failed"), stored.model_dump_json(), request_id="r3")
    assert (await client.get_operation("create_note", "running")).state is OperationState.IN_PROGRESS
    assert (await client.get_operation("create_note", "lost")).state is OperationState.UNKNOWN
    failed = await client.get_operation(request_id="r3")
    assert failed.state is OperationState.FAILED and failed.result == stored


async def test_unknown_keys_and_other_principals_keys_are_not_found(client: AsyncClient, pipeline: Pipeline) -> None:
    await pipeline.store.claim(scope("theirs", "user-2"), "h", "r9", deadline_at=time.time() + 60)
    assert (await client.get_operation("create_note", "never")).state is OperationState.NOT_FOUND
    assert (await client.get_operation("create_note", "theirs")).state is OperationState.NOT_FOUND
    assert (await client.get_operation(request_id="r9")).state is OperationState.NOT_FOUND


async def test_a_request_naming_no_operation_is_invalid(client: AsyncClient) -> None:
    with pytest.raises(ClientError) as caught:
        await client.get_operation("create_note")
    assert caught.value.code.name == "INVALID_ARGUMENT"
