"""Typed clients for agent processes: ``AsyncClient`` (asyncio) and ``Client`` (blocking).

Both return domain models and raise ``ClientError`` for every gRPC failure
(UNAUTHENTICATED, UNAVAILABLE, DEADLINE_EXCEEDED …); denials and tool failures are
not exceptions but ``ToolResult``s with ``status`` and ``error``::

    async with AsyncClient("unix:///run/toolbooth/toolbooth.sock", token=jwt) as client:
        result = await client.execute("calculate", {"operation": "add", "operands": [1, 2]})
        results = await client.execute_batch([call_request("echo", {"text": "a"}),
                                              call_request("create_note", {"text": "b"}, idempotency_key="k-1")],
                                             cancel_on_permanent_failure=True)
        async with contextlib.aclosing(client.execute_stream("index", {"path": "/"})) as events:
            async for event in events:  # Progress reports, then the ToolResult
                ...
        tools = await client.tool_schemas("openai")  # or "anthropic", "mcp": for a model's tool calling

Leaving a stream early (closing it, as ``aclosing`` does) cancels the call: a read stops, a started
write finishes and is recorded (``docs/agents.md``). Over TCP to a sidecar serving TLS, pass
``tls=ClientTls(ca_file=...)`` (``sidecar.client_tls``; with ``cert_file`` and ``key_file`` for mutual TLS).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import grpc

from sidecar.api import convert, schemas
from sidecar.api.schemas import SchemaFormat
from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.client_tls import ClientTls, open_aio_channel, open_channel
from sidecar.contract import (
    ApprovalResult,
    CallBatch,
    CallRequest,
    Operation,
    Preview,
    ReloadStatus,
    ToolEvent,
    ToolListing,
    ToolResult,
)

__all__ = ["AsyncClient", "Client", "ClientError", "ClientTls", "call_request"]

Response = TypeVar("Response")
_Arguments = Mapping[str, Any] | str


class ClientError(Exception):
    """A call failed at the gRPC level; ``code`` says why (e.g. ``UNAUTHENTICATED``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class _Base:
    """What both clients share: credentials, default timeout and request building."""

    def __init__(self, *, token: str | None, timeout: float | None) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout

    def _timeout_or_default(self, timeout: float | None) -> float | None:
        return self._timeout if timeout is None else timeout


class AsyncClient(_Base):
    """An asyncio client; ``target`` is any gRPC target (``unix:PATH``, ``unix:///ABS``, ``HOST:PORT``, ``dns:``...),
    ``tls`` how a TCP target's TLS is checked (``None``: plaintext)."""

    def __init__(self, target: str, *, token: str | None = None, timeout: float | None = None,
                 tls: ClientTls | None = None) -> None:
        super().__init__(token=token, timeout=timeout)
        self._channel = open_aio_channel(target, tls)
        self._stub = pb_grpc.ToolServiceStub(self._channel)
        self._policy = pb_grpc.PolicyServiceStub(self._channel)
        self._approvals = pb_grpc.ApprovalServiceStub(self._channel)

    async def list_tools(self, *, conversation_id: str | None = None) -> ToolListing:
        """The tools the caller may see."""
        request = pb.ListToolsRequest(conversation_id=conversation_id or "")
        return convert.listing_from_pb(await self._call(self._stub.ListTools, request, None))

    async def tool_schemas(self, format: SchemaFormat | str, *,
                           conversation_id: str | None = None) -> list[dict[str, Any]]:
        """The tools the caller may see as ``openai``, ``anthropic`` or ``mcp`` tool objects
        (``sidecar.api.schemas``), ready for a model provider's ``tools`` parameter."""
        wanted = schemas.schema_format(format)
        return schemas.tool_schemas((await self.list_tools(conversation_id=conversation_id)).tools, wanted)

    async def policy_status(self) -> ReloadStatus:
        """The policy revision in force and the last reload attempt."""
        request = pb.GetPolicyStatusRequest()
        return convert.status_from_pb(await self._call(self._policy.GetPolicyStatus, request, None))

    async def execute(
        self,
        tool: str,
        arguments: _Arguments = "{}",
        *,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        conversation_id: str | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> ToolResult:
        """Run one call; denials and tool failures come back as the result's ``error``."""
        request = _execute_request(tool, arguments, idempotency_key, approval_id, conversation_id, call_id)
        return convert.result_from_pb(await self._call(self._stub.ExecuteTool, request, timeout))

    async def execute_batch(self, calls: Iterable[CallRequest], *, max_concurrency: int = 0,
                            cancel_on_permanent_failure: bool = False,
                            timeout: float | None = None) -> list[ToolResult]:
        """Run the calls of one model reply (``call_request`` builds each); their results in the same order."""
        request = _batch_request(calls, max_concurrency, cancel_on_permanent_failure)
        return convert.batch_results_from_pb(await self._call(self._stub.ExecuteToolBatch, request, timeout))

    async def execute_stream(
        self,
        tool: str,
        arguments: _Arguments = "{}",
        *,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        conversation_id: str | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> AsyncGenerator[ToolEvent, None]:
        """Run one call and yield its ``Progress`` reports, then its ``ToolResult`` (the last event). Closing the
        iterator before the result cancels the call."""
        request = _execute_request(tool, arguments, idempotency_key, approval_id, conversation_id, call_id)
        stream = self._stub.ExecuteToolStream(request, metadata=self._metadata,
                                              timeout=self._timeout_or_default(timeout))
        try:
            async for event in stream:
                yield convert.event_from_pb(event)
        except grpc.RpcError as exc:
            raise _client_error(exc) from exc
        finally:
            stream.cancel()

    async def get_operation(self, tool: str | None = None, idempotency_key: str | None = None, *,
                            request_id: str | None = None) -> Operation:
        """Where one of the caller's keyed calls stands: by ``tool`` and ``idempotency_key``, or ``request_id``."""
        request = _operation_request(tool, idempotency_key, request_id)
        return convert.operation_from_pb(await self._call(self._stub.GetOperation, request, None))

    async def approve(self, preview_id: str, preview_hash: str, *, comment: str | None = None) -> ApprovalResult:
        """Approve the preview whose hash the approver saw (an approver's token)."""
        request = pb.ApproveOperationRequest(preview_id=preview_id, preview_hash=preview_hash, comment=comment or "")
        return convert.approval_from_pb(await self._call(self._approvals.ApproveOperation, request, None))

    async def deny(self, preview_id: str, *, reason: str) -> ApprovalResult:
        """Deny a pending preview, saying why."""
        request = pb.DenyOperationRequest(preview_id=preview_id, reason=reason)
        return convert.approval_from_pb(await self._call(self._approvals.DenyOperation, request, None))

    async def previews(self, *, limit: int = 0) -> list[Preview]:
        """The newest pending previews the caller may approve (operators: all): the first page."""
        return (await self.previews_page(limit=limit))[0]

    async def previews_page(self, *, limit: int = 0, page_token: str = "") -> tuple[list[Preview], str]:
        """A page of the pending previews the caller may approve (operators: all), newest first, after
        ``page_token``; and the token of the next page (``""`` on the last)."""
        request = pb.ListPreviewsRequest(limit=limit, page_token=page_token)
        return _page(await self._call(self._approvals.ListPreviews, request, None))

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Awaitable[Response]], request: Any,
                    timeout: float | None) -> Response:
        try:
            return await method(request, metadata=self._metadata, timeout=self._timeout_or_default(timeout))
        except grpc.RpcError as exc:
            raise _client_error(exc) from exc


class Client(_Base):
    """A blocking client; ``target`` is any gRPC target (``unix:PATH``, ``unix:///ABS``, ``HOST:PORT``, ``dns:``...),
    ``tls`` how a TCP target's TLS is checked (``None``: plaintext)."""

    def __init__(self, target: str, *, token: str | None = None, timeout: float | None = None,
                 tls: ClientTls | None = None) -> None:
        super().__init__(token=token, timeout=timeout)
        self._channel = open_channel(target, tls)
        self._stub = pb_grpc.ToolServiceStub(self._channel)
        self._policy = pb_grpc.PolicyServiceStub(self._channel)
        self._approvals = pb_grpc.ApprovalServiceStub(self._channel)

    def list_tools(self, *, conversation_id: str | None = None) -> ToolListing:
        """The tools the caller may see."""
        request = pb.ListToolsRequest(conversation_id=conversation_id or "")
        return convert.listing_from_pb(self._call(self._stub.ListTools, request, None))

    def tool_schemas(self, format: SchemaFormat | str, *, conversation_id: str | None = None) -> list[dict[str, Any]]:
        """The tools the caller may see as ``openai``, ``anthropic`` or ``mcp`` tool objects
        (``sidecar.api.schemas``), ready for a model provider's ``tools`` parameter."""
        wanted = schemas.schema_format(format)
        return schemas.tool_schemas(self.list_tools(conversation_id=conversation_id).tools, wanted)

    def policy_status(self) -> ReloadStatus:
        """The policy revision in force and the last reload attempt."""
        request = pb.GetPolicyStatusRequest()
        return convert.status_from_pb(self._call(self._policy.GetPolicyStatus, request, None))

    def execute(
        self,
        tool: str,
        arguments: _Arguments = "{}",
        *,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        conversation_id: str | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> ToolResult:
        """Run one call; denials and tool failures come back as the result's ``error``."""
        request = _execute_request(tool, arguments, idempotency_key, approval_id, conversation_id, call_id)
        return convert.result_from_pb(self._call(self._stub.ExecuteTool, request, timeout))

    def execute_batch(self, calls: Iterable[CallRequest], *, max_concurrency: int = 0,
                      cancel_on_permanent_failure: bool = False, timeout: float | None = None) -> list[ToolResult]:
        """Run the calls of one model reply (``call_request`` builds each); their results in the same order."""
        request = _batch_request(calls, max_concurrency, cancel_on_permanent_failure)
        return convert.batch_results_from_pb(self._call(self._stub.ExecuteToolBatch, request, timeout))

    def execute_stream(
        self,
        tool: str,
        arguments: _Arguments = "{}",
        *,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        conversation_id: str | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> Iterator[ToolEvent]:
        """Run one call and yield its ``Progress`` reports, then its ``ToolResult`` (the last event). Closing the
        iterator before the result cancels the call."""
        request = _execute_request(tool, arguments, idempotency_key, approval_id, conversation_id, call_id)
        stream = self._stub.ExecuteToolStream(request, metadata=self._metadata,
                                              timeout=self._timeout_or_default(timeout))
        try:
            for event in stream:
                yield convert.event_from_pb(event)
        except grpc.RpcError as exc:
            raise _client_error(exc) from exc
        finally:
            stream.cancel()

    def get_operation(self, tool: str | None = None, idempotency_key: str | None = None, *,
                      request_id: str | None = None) -> Operation:
        """Where one of the caller's keyed calls stands: by ``tool`` and ``idempotency_key``, or ``request_id``."""
        request = _operation_request(tool, idempotency_key, request_id)
        return convert.operation_from_pb(self._call(self._stub.GetOperation, request, None))

    def approve(self, preview_id: str, preview_hash: str, *, comment: str | None = None) -> ApprovalResult:
        """Approve the preview whose hash the approver saw (an approver's token)."""
        request = pb.ApproveOperationRequest(preview_id=preview_id, preview_hash=preview_hash, comment=comment or "")
        return convert.approval_from_pb(self._call(self._approvals.ApproveOperation, request, None))

    def deny(self, preview_id: str, *, reason: str) -> ApprovalResult:
        """Deny a pending preview, saying why."""
        request = pb.DenyOperationRequest(preview_id=preview_id, reason=reason)
        return convert.approval_from_pb(self._call(self._approvals.DenyOperation, request, None))

    def previews(self, *, limit: int = 0) -> list[Preview]:
        """The newest pending previews the caller may approve (operators: all): the first page."""
        return self.previews_page(limit=limit)[0]

    def previews_page(self, *, limit: int = 0, page_token: str = "") -> tuple[list[Preview], str]:
        """A page of the pending previews the caller may approve (operators: all), newest first, after
        ``page_token``; and the token of the next page (``""`` on the last)."""
        request = pb.ListPreviewsRequest(limit=limit, page_token=page_token)
        return _page(self._call(self._approvals.ListPreviews, request, None))

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _call(self, method: Callable[..., Response], request: Any, timeout: float | None) -> Response:
        try:
            return method(request, metadata=self._metadata, timeout=self._timeout_or_default(timeout))
        except grpc.RpcError as exc:
            raise _client_error(exc) from exc


def _page(response: pb.ListPreviewsResponse) -> tuple[list[Preview], str]:
    return [convert.preview_from_pb(p) for p in response.previews], response.next_page_token


def call_request(
    tool: str,
    arguments: _Arguments = "{}",
    *,
    idempotency_key: str | None = None,
    approval_id: str | None = None,
    conversation_id: str | None = None,
    call_id: str | None = None,
) -> CallRequest:
    """One call of a batch, given as ``execute`` takes it (``arguments``: a mapping, or its JSON text as is)."""
    arguments_json = arguments if isinstance(arguments, str) else json.dumps(dict(arguments), separators=(",", ":"))
    return CallRequest(tool=tool, arguments_json=arguments_json, idempotency_key=idempotency_key,
                       approval_id=approval_id, conversation_id=conversation_id, call_id=call_id)


def _execute_request(
    tool: str,
    arguments: _Arguments,
    idempotency_key: str | None,
    approval_id: str | None,
    conversation_id: str | None,
    call_id: str | None,
) -> pb.ExecuteToolRequest:
    return convert.call_request_to_pb(call_request(tool, arguments, idempotency_key=idempotency_key,
                                                   approval_id=approval_id, conversation_id=conversation_id,
                                                   call_id=call_id))


def _batch_request(calls: Iterable[CallRequest], max_concurrency: int,
                   cancel_on_permanent_failure: bool) -> pb.ExecuteToolBatchRequest:
    return convert.batch_to_pb(CallBatch(calls=tuple(calls), max_concurrency=max_concurrency,
                                         cancel_on_permanent_failure=cancel_on_permanent_failure))


def _operation_request(tool: str | None, idempotency_key: str | None, request_id: str | None
                       ) -> pb.GetOperationRequest:
    return pb.GetOperationRequest(tool=tool or "", idempotency_key=idempotency_key or "", request_id=request_id or "")


def _client_error(exc: grpc.RpcError) -> ClientError:
    """``grpc.RpcError`` raised by a call is also a ``grpc.Call`` carrying code and details."""
    call: Any = exc
    return ClientError(call.code(), call.details() or "")
