"""``AuthInterceptor``: every Toolbooth call is authenticated before any servicer code runs.

The ``Authenticator`` turns the call's metadata into a ``Principal``; a refusal raises
``AuthenticationError``, which the ``StatusInterceptor`` around this one sends as UNAUTHENTICATED
with its constant message. The principal reaches the servicer through a context variable set only
while the call runs: servicers read it with ``current_principal()``.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TypeVar

from sidecar.contract import Principal
from sidecar.server.auth import Authenticator
from sidecar.server.interceptors.unary import Proceed, Rpc, UnaryInterceptor

__all__ = ["AuthInterceptor", "current_principal"]

T = TypeVar("T")

_principal: ContextVar[Principal] = ContextVar("toolbooth_principal")


def current_principal() -> Principal:
    """The authenticated caller of the Toolbooth call being served (only inside a servicer method)."""
    try:
        return _principal.get()
    except LookupError:
        raise RuntimeError("no authenticated caller: the AuthInterceptor does not wrap this code") from None


class AuthInterceptor(UnaryInterceptor):
    """Authenticates each call and makes its principal the ``current_principal()`` while it runs."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    async def around(self, rpc: Rpc, proceed: Proceed[T]) -> T:
        """Authenticate ``rpc`` (or raise ``AuthenticationError``), then serve it as that principal."""
        token = _principal.set(await self._authenticator.authenticate(rpc.metadata))
        try:
            return await proceed()
        finally:
            _principal.reset(token)
