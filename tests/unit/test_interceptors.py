"""The interceptors' pieces without a server: the status table, the principal hand-off, which methods."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from sidecar.errors import (
    AuthenticationError,
    InvalidRequestError,
    MalformedDecisionError,
    PolicyEvaluationError,
    StoreUnavailableError,
)
from sidecar.server.interceptors import current_principal
from sidecar.server.interceptors.status import status_of
from sidecar.server.interceptors.unary import behavior_of, is_toolbooth_method


@pytest.mark.parametrize(("exc", "status"), [
    (AuthenticationError("token expired"), (grpc.StatusCode.UNAUTHENTICATED, "token expired")),
    (InvalidRequestError("tool is required"), (grpc.StatusCode.INVALID_ARGUMENT, "tool is required")),
    (StoreUnavailableError("disk /x full"), (grpc.StatusCode.UNAVAILABLE, "service unavailable")),
    (PolicyEvaluationError("opa down"), (grpc.StatusCode.UNAVAILABLE, "service unavailable")),
    (MalformedDecisionError("rule x"), (grpc.StatusCode.UNAVAILABLE, "service unavailable")),
    (ValueError("password=hunter2"), (grpc.StatusCode.INTERNAL, "internal error")),
])
def test_status_of_sends_only_constant_messages(exc: Exception, status: tuple[grpc.StatusCode, str]) -> None:
    assert status_of(exc) == status


def test_there_is_no_principal_outside_a_call() -> None:
    with pytest.raises(RuntimeError, match="no authenticated caller"):
        current_principal()


@pytest.mark.parametrize(("method", "ours"), [
    ("/toolbooth.v1.ToolService/ExecuteTool", True),
    ("/toolbooth.v1.ApprovalService/ListPreviews", True),
    ("/grpc.health.v1.Health/Check", False),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", False),
    ("/toolbooth.v10.X/Y", False),
])
def test_only_toolbooth_methods_are_intercepted(method: str, ours: bool) -> None:
    assert is_toolbooth_method(method) is ours


async def _coroutine(request: object, context: object) -> None: ...


async def _generator(request: object, context: object) -> AsyncIterator[object]:
    yield request


def test_a_stream_served_by_a_generator_is_refused_not_served_without_authentication() -> None:
    behavior, rewrap = behavior_of("/toolbooth.v1.ToolService/ExecuteToolStream",
                                   grpc.unary_stream_rpc_method_handler(_coroutine))
    assert behavior is _coroutine and rewrap is grpc.unary_stream_rpc_method_handler
    with pytest.raises(TypeError, match="only unary methods and server streams served by a coroutine"):
        behavior_of("/toolbooth.v1.ToolService/ExecuteToolStream", grpc.unary_stream_rpc_method_handler(_generator))
