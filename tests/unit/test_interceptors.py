"""The interceptors' pieces without a server: the status table, the principal hand-off, how methods are wrapped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.errors import (
    AuthenticationError,
    InvalidRequestError,
    MalformedDecisionError,
    PolicyEvaluationError,
    StoreUnavailableError,
)
from sidecar.server.interceptors import current_principal
from sidecar.server.interceptors.status import StatusInterceptor, status_of
from sidecar.server.interceptors.unary import Layered, behavior_of
from sidecar.server.tool_service import ToolGateway, ToolServicer


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


class _Server:
    """What ``Layered.add`` registers on a server."""

    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler] = []
        self.by_name: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        self.by_name[service] = handlers


def test_layered_registers_each_method_wrapped_by_name_and_as_a_generic_handler() -> None:
    server, servicer = _Server(), ToolServicer(cast(ToolGateway, None))
    Layered([StatusInterceptor()]).add(cast(grpc.aio.Server, server), pb_grpc.add_ToolServiceServicer_to_server,
                                       servicer)
    handlers = server.by_name["toolbooth.v1.ToolService"]
    assert set(handlers) == {"ListTools", "ExecuteTool", "GetOperation", "ExecuteToolBatch", "ExecuteToolStream"}
    assert handlers["ExecuteTool"].unary_unary not in (None, cast(Any, servicer.ExecuteTool))
    [generic] = server.generic
    details = cast(grpc.HandlerCallDetails, SimpleNamespace(method="/toolbooth.v1.ToolService/ExecuteTool"))
    assert generic.service(details) is handlers["ExecuteTool"]


def test_generated_code_that_registers_no_method_by_name_is_refused() -> None:
    def old_add(servicer: object, server: Any) -> None:
        server.add_generic_rpc_handlers(())

    with pytest.raises(TypeError, match="'old_add' registered no method by name"):
        Layered([]).add(cast(grpc.aio.Server, _Server()), old_add, object())


async def _coroutine(request: object, context: object) -> None: ...


async def _generator(request: object, context: object) -> AsyncIterator[object]:
    yield request


def test_a_stream_served_by_a_generator_is_refused_not_served_without_authentication() -> None:
    behavior, rewrap = behavior_of("/toolbooth.v1.ToolService/ExecuteToolStream",
                                   grpc.unary_stream_rpc_method_handler(_coroutine))
    assert behavior is _coroutine and rewrap is grpc.unary_stream_rpc_method_handler
    with pytest.raises(TypeError, match="only unary methods and server streams served by a coroutine"):
        behavior_of("/toolbooth.v1.ToolService/ExecuteToolStream", grpc.unary_stream_rpc_method_handler(_generator))
