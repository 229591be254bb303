"""``UnaryInterceptor``: code that runs around every RPC of Toolbooth's own services (each served by a coroutine).

A ``grpc.aio.ServerInterceptor`` only chooses the method handler: ``intercept_service`` returns
before the servicer method runs, so an exception the servicer raises never passes through it, and
what it sets there is not guaranteed to be seen by the servicer. So this base class returns a
handler whose behaviour wraps the servicer's: a subclass's ``around`` gets the call and a
``proceed`` that runs the rest of the chain and the servicer method, in the same task, inside any
``try`` or context variable it sets up. Status mapping and authentication are such subclasses; an
access log, metrics or tracing would be others.

Only ``toolbooth.v1.*`` methods are wrapped; health and reflection pass through untouched. Every
Toolbooth method is served by a coroutine: a unary one returns its reply; a server-streaming one
(``ExecuteToolStream``) writes its replies with ``context.write`` and returns ``None``, so ``around``
wraps the whole stream alike (authenticated before the first reply, an exception mapped to a status
at any point). A method served otherwise (a generator) is refused here rather than served without
authentication.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb

__all__ = ["TOOLBOOTH_METHOD_PREFIX", "Behavior", "Proceed", "Rpc", "UnaryInterceptor", "behavior_of",
           "is_toolbooth_method"]

TOOLBOOTH_METHOD_PREFIX = f"/{pb.DESCRIPTOR.package}."

Request = TypeVar("Request")
Response = TypeVar("Response")
T = TypeVar("T")
Proceed = Callable[[], Awaitable[T]]
_Context = grpc.aio.ServicerContext[Any, Any]
_Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Request, Response] | None"]]
Behavior = Callable[[Any, _Context], Awaitable[Any]]
_Rewrap = Callable[[Behavior, Any, Any], "grpc.RpcMethodHandler[Any, Any]"]  # (behavior, deserializer, serializer)


@dataclass(frozen=True)
class Rpc:
    """One call as an interceptor sees it: the full method name, the caller's metadata, the context."""

    method: str
    metadata: Sequence[tuple[str, str | bytes]]
    context: _Context


def is_toolbooth_method(method: str) -> bool:
    """Whether ``method`` (``/package.Service/Method``) belongs to one of Toolbooth's own services."""
    return method.startswith(TOOLBOOTH_METHOD_PREFIX)


def behavior_of(method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> tuple[Behavior, _Rewrap]:
    """The coroutine that serves ``handler``'s calls, and how to make a handler of the same kind around
    another one; ``TypeError`` for a method that is neither unary nor a server stream served by a coroutine."""
    # grpc's stubs type behaviours as synchronous; a grpc.aio servicer's methods are coroutines.
    if handler.unary_unary is not None:
        return cast(Behavior, handler.unary_unary), grpc.unary_unary_rpc_method_handler
    if handler.unary_stream is not None and inspect.iscoroutinefunction(handler.unary_stream):
        return cast(Behavior, handler.unary_stream), grpc.unary_stream_rpc_method_handler
    raise TypeError(f"{method}: only unary methods and server streams served by a coroutine can be intercepted")


class UnaryInterceptor(grpc.aio.ServerInterceptor, abc.ABC):
    """Runs ``around`` around every ``toolbooth.v1`` method (unary, or a server stream served by a coroutine);
    other services are left alone."""

    @abc.abstractmethod
    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        """Serve ``rpc``: usually ``return await proceed()``, with something before, after or around it."""

    async def intercept_service(
        self, continuation: _Continuation[Request, Response], handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Request, Response] | None:
        """The handler of the method, its behaviour wrapped in ``around`` for Toolbooth's methods."""
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not is_toolbooth_method(method):
            return handler
        behavior, rewrap = behavior_of(method, handler)
        metadata = tuple(handler_call_details.invocation_metadata or ())

        async def wrapped(request: Any, context: _Context) -> Any:
            return await self.around(Rpc(method, metadata, context), lambda: behavior(request, context))

        return rewrap(wrapped, handler.request_deserializer, handler.response_serializer)
