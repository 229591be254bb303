"""How an HTTP listener that runs calls (MCP, HTTP/JSON) stops: no new connection, then the calls in flight
get the grace (``server.shutdown_grace_seconds``) to finish before uvicorn closes what is left.

uvicorn's own graceful shutdown cancels a request still running at its end, and the caller gets its
untyped ``500``. ``InFlight`` counts the requests being answered, and ``InFlight.drain`` closes the
listening sockets and waits, within the grace, until none is; the listener then answers or ends those
still running itself before it shuts uvicorn down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["InFlight"]

log = logging.getLogger(__name__)


class InFlight:
    """ASGI: counts the requests being answered other than event streams (GET), so a stop can wait for them."""

    def __init__(self, app: ASGIApp) -> None:
        self._app, self._count = app, 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        counted = scope["type"] == "http" and scope.get("method") != "GET"
        if counted:
            self._count += 1
            self.idle.clear()
        try:
            await self._app(scope, receive, send)
        finally:
            if counted:
                self._count -= 1
                if self._count == 0:
                    self.idle.set()

    async def drain(self, server: uvicorn.Server, grace: float, what: str) -> bool:
        """Close ``server``'s listening sockets (it takes no new connection), then wait up to ``grace`` seconds
        for the requests in flight; whether none is left."""
        for listening in server.servers:
            listening.close()
        if not self.idle.is_set():
            log.info("%s stopping: waiting up to %g s for the calls in flight", what, grace)
        return await self.settled(grace)

    async def settled(self, seconds: float) -> bool:
        """Wait up to ``seconds`` until no request is in flight; whether none is."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.idle.wait()
        return self.idle.is_set()
