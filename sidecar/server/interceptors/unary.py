"""``UnaryInterceptor``: code that runs around every RPC of Toolbooth's own services (each served by a coroutine),
and ``Layered``, which registers those services with their handlers wrapped in the layers.

A ``grpc.aio.ServerInterceptor`` only chooses the method handler: ``intercept_service`` returns
before the servicer method runs, so an exception the servicer raises never passes through it, and
what it sets there is not guaranteed to be seen by the servicer. So a layer's ``around`` gets the
call and a ``proceed`` that runs the inner layers and the servicer method, in the same task, inside
any ``try`` or context variable it sets up. Status mapping, authentication, the access log, metrics
and the trace context are such layers.

``Layered.add`` registers a service with each method's handler wrapped in all the layers, once: gRPC finds the
wrapped handler by its method name as it finds any, and an RPC pays a coroutine per layer, with no
``grpc.aio.ServerInterceptor`` (whose ``intercept_service`` and continuation coroutines gRPC would run for every
RPC, health checks included). Request bytes that do not decode as the method's message reach the layers as
``Rpc.undecodable`` (the status layer refuses them with INVALID_ARGUMENT, before authentication), never the
servicer.

Only the services added through ``Layered.add`` (``toolbooth.v1.*``) are wrapped; health and reflection are
registered on the server directly and pass untouched. Every
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
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError

from sidecar.errors import InvalidRequestError

__all__ = ["UNDECODABLE_DETAILS", "Behavior", "Layered", "Proceed", "Rpc", "UnaryInterceptor", "behavior_of"]

UNDECODABLE_DETAILS = "the request is not a valid protobuf message of this method"

T = TypeVar("T")
Proceed = Callable[[], Awaitable[T]]
_Context = grpc.aio.ServicerContext[Any, Any]
Behavior = Callable[[Any, _Context], Awaitable[Any]]
_Rewrap = Callable[[Behavior, Any, Any], "grpc.RpcMethodHandler[Any, Any]"]  # (behavior, deserializer, serializer)
_Served = Callable[["Rpc", Any], Awaitable[Any]]  # one layer and all inside it, for one request


class Rpc:
    """One call as a layer sees it: the full method name, the caller's metadata, the context, and whether the
    request bytes failed to decode as the method's message."""

    __slots__ = ("context", "metadata", "method", "undecodable")

    def __init__(self, method: str, metadata: Sequence[tuple[str, str | bytes]], context: _Context,
                 undecodable: bool = False) -> None:
        self.method, self.metadata, self.context, self.undecodable = method, metadata, context, undecodable


def behavior_of(method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> tuple[Behavior, _Rewrap]:
    """The coroutine that serves ``handler``'s calls, and how to make a handler of the same kind around
    another one; ``TypeError`` for a method that is neither unary nor a server stream served by a coroutine."""
    # grpc's stubs type behaviours as synchronous; a grpc.aio servicer's methods are coroutines.
    if handler.unary_unary is not None:
        return cast(Behavior, handler.unary_unary), grpc.unary_unary_rpc_method_handler
    if handler.unary_stream is not None and inspect.iscoroutinefunction(handler.unary_stream):
        return cast(Behavior, handler.unary_stream), grpc.unary_stream_rpc_method_handler
    raise TypeError(f"{method}: only unary methods and server streams served by a coroutine can be intercepted")


class UnaryInterceptor(abc.ABC):
    """A layer around every ``toolbooth.v1`` method (unary, or a server stream served by a coroutine), run by
    ``Layered``."""

    @abc.abstractmethod
    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        """Serve ``rpc``: usually ``return await proceed()``, with something before, after or around it."""


class _Undecodable:
    """What the lenient request deserializer gives for bytes that are not the method's message."""


class Layered:
    """``layers`` (outermost first) around every method of the services ``add`` registers, each method's handler
    wrapped once."""

    def __init__(self, layers: Sequence[UnaryInterceptor]) -> None:
        self.layers = tuple(layers)

    def add(self, server: grpc.aio.Server, add_servicer: Callable[[Any, Any], None], servicer: Any) -> None:
        """Register ``servicer`` on ``server`` with ``add_servicer`` (a generated ``add_*Servicer_to_server``),
        every method's handler wrapped in the layers."""
        registering = _Registering(server, self._wrapped)
        add_servicer(servicer, registering)
        if not registering.services:
            raise TypeError(f"{getattr(add_servicer, '__name__', add_servicer)!r} registered no method by name: "
                            "the generated gRPC code is older than this server needs")

    def _wrapped(self, method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        behavior, rewrap = behavior_of(method, handler)
        decode = handler.request_deserializer

        def lenient(data: bytes) -> Any:
            try:
                return data if decode is None else decode(data)
            except DecodeError:
                return _Undecodable()

        async def servicer(rpc: Rpc, request: Any) -> Any:
            if rpc.undecodable:  # never served, even where no layer refused it
                raise InvalidRequestError(UNDECODABLE_DETAILS)
            return await behavior(request, rpc.context)

        served: _Served = servicer
        for layer in reversed(self.layers):
            served = _around(layer, served)

        async def serve(request: Any, context: _Context) -> Any:
            metadata = cast("Sequence[tuple[str, str | bytes]]", context.invocation_metadata() or ())
            rpc = Rpc(method, metadata, context, type(request) is _Undecodable)
            return await served(rpc, request)

        return rewrap(serve, lenient, handler.response_serializer)


class _Registering:
    """What a generated ``add_*Servicer_to_server`` is given in place of the server: the handlers it registers by
    name are wrapped, then registered on the server both by name and as a generic handler (what the generated code
    registers itself, but wrapped)."""

    def __init__(self, server: grpc.aio.Server,
                 wrap: Callable[[str, grpc.RpcMethodHandler[Any, Any]], grpc.RpcMethodHandler[Any, Any]]) -> None:
        self._server, self._wrap = server, wrap
        self.services: list[str] = []

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        wrapped = {name: self._wrap(f"/{service}/{name}", handler) for name, handler in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        self._server.add_registered_method_handlers(service, wrapped)
        self.services.append(service)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Left out: the same handlers, registered by name, are wrapped and added as a generic handler too."""


def _around(layer: UnaryInterceptor, inner: _Served) -> _Served:
    """``layer`` around ``inner``: the layer's own coroutine, with no coroutine of its own around it."""
    around = layer.around

    def served(rpc: Rpc, request: Any) -> Awaitable[Any]:
        return around(rpc, lambda: inner(rpc, request))

    return served
