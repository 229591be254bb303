"""What bounds every HTTP listener of the sidecar, with no HTTP server library imported, and the guard of the one
whose server has no such bounds (metrics, aiohttp).

``check_descriptors`` (run once before anything opens, by ``sidecar.cli.preflight``) refuses to start when
the caps of the listeners that are on (each of ``sidecar.config.endpoints``: its ``http.max_connections``)
could together take more than half of the process's file descriptors (``RLIMIT_NOFILE``): the rest is left
to gRPC, the store, the policy and the logs. What both guards share: ``refused`` answers a connection past
a cap ``503`` and closes it at once; a ``Deadline`` runs until a request (or its head) arrives, and
``expire`` closes a connection whose request came too late (``408`` first when no answer may be under
way). Their records, and asyncio's accept errors, are rate-limited (``sidecar.telemetry.repeats``).

aiohttp holds any number of connections and closes one whose request has not arrived only at its keep-alive
timer (an hour by default; in recent releases from the connection, in older ones only after a response),
without an answer. ``guarded`` wraps its protocol factory: past ``max_connections`` a connection is refused, and one
whose request head (up to its blank line) has not arrived within ``header_timeout_seconds`` of the
connection or of the head's first byte is closed. The metrics endpoint sets that timer to
``idle_timeout_seconds``: a head is therefore due within the smaller of the two, and the guard's deadline
is that smaller one (armed first, so that a late first head is answered ``408`` on every release). The
metrics endpoint answers ``GET`` only: whatever follows a head is read as the next head.
"""

from __future__ import annotations

import asyncio
import http
import logging
import resource
from collections.abc import Callable

from sidecar.config import Settings
from sidecar.config.endpoints import ENDPOINTS
from sidecar.config.http import HttpConnectionSettings
from sidecar.telemetry.repeats import limit_repeats

__all__ = ["Deadline", "check_descriptors", "expire", "guarded", "limit_flood_records", "refused"]

log = logging.getLogger(__name__)

_HEAD_END = b"\r\n\r\n"


def check_descriptors(settings: Settings) -> None:
    """``OSError`` naming their keys when the caps of the HTTP listeners that are on could together take more
    than half of this process's file descriptors."""
    caps = {f"{row.section}.http.max_connections": row.settings(settings).http.max_connections
            for row in ENDPOINTS if row.listen(settings) is not None}
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and 2 * sum(caps.values()) > soft:
        named = " + ".join(f"{key} {cap}" for key, cap in caps.items())
        raise OSError(f"the HTTP listeners may hold {sum(caps.values())} connections "
                      f"({named}), more than half of the {soft} files this process may open (RLIMIT_NOFILE); "
                      "lower them or raise the limit (ulimit -n, systemd's LimitNOFILE=)")


def limit_flood_records(*names: str) -> None:
    """Rate-limit the records a flood of connections writes: asyncio's accept errors, the refusals, and those of
    the loggers ``names`` (the server library's)."""
    limit_repeats("asyncio", __name__, *names)


def _answer(status: http.HTTPStatus) -> bytes:
    """A whole response that closes the connection, written before (or instead of) any request."""
    body = f"{status.phrase}\n".encode()
    return (f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


_BUSY, _TOO_SLOW = _answer(http.HTTPStatus.SERVICE_UNAVAILABLE), _answer(http.HTTPStatus.REQUEST_TIMEOUT)


def refused(transport: asyncio.BaseTransport, listener: str, held: int, cap: int) -> bool:
    """Whether a new connection is past ``listener``'s ``cap`` (it holds ``held``): then it is answered ``503``
    and closed."""
    if held < cap:
        return False
    assert isinstance(transport, asyncio.WriteTransport)
    transport.write(_BUSY)
    transport.close()
    log.warning("%s: refused a connection: %d are open (%s.http.max_connections)", listener, held, listener)
    return True


def expire(transport: asyncio.WriteTransport, listener: str, *, answering: bool) -> None:
    """Close a connection whose request did not arrive in time, with a ``408`` unless an answer may be under way
    (``answering``); nothing when it is closing already."""
    if transport.is_closing():
        return
    if not answering:
        transport.write(_TOO_SLOW)
    log.debug("%s: closed a connection whose request did not arrive in time", listener)
    transport.close()


class Deadline:
    """A connection's one pending deadline (``when``, on the loop's clock), calling ``fire`` when it passes."""

    def __init__(self, fire: Callable[[], None]) -> None:
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self.when: float | None = None  # None: none is armed

    def arm(self, when: float) -> None:
        """Replace the deadline with one at ``when``."""
        self.stop()
        self.when, self._handle = when, asyncio.get_running_loop().call_at(when, self._passed)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self.when = None

    def _passed(self) -> None:
        self._handle = self.when = None
        self._fire()


def guarded(factory: Callable[[], asyncio.BaseProtocol], listener: str,
            settings: HttpConnectionSettings) -> Callable[[], asyncio.Protocol]:
    """A protocol factory serving ``factory``'s protocols within ``settings`` (its cap and header timeout)."""
    limit_flood_records("aiohttp.server")
    held: set[_Guarded] = set()
    return lambda: _Guarded(factory, listener, settings, held)


class _Guarded(asyncio.Protocol):
    """One connection: refused past the cap, closed when a head is late, else served by the wrapped protocol."""

    def __init__(self, factory: Callable[[], asyncio.BaseProtocol], listener: str,
                 settings: HttpConnectionSettings, held: set[_Guarded]) -> None:
        self._factory, self._listener, self._settings, self._held = factory, listener, settings, held
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._deadline = Deadline(self._expire)
        self._tail = b""  # the last bytes of a head being received (its blank line may straddle two reads)
        self._served = False  # a whole head arrived before

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if refused(transport, self._listener, len(self._held), self._settings.max_connections):
            return
        assert isinstance(transport, asyncio.WriteTransport)
        inner = self._factory()
        assert isinstance(inner, asyncio.Protocol)
        self._held.add(self)
        self._inner, self._transport = inner, transport
        self._arm()  # before the inner protocol's keep-alive timer, which may fall due at the same moment
        inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        self._watch(data)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            return
        self._held.discard(self)
        self._deadline.stop()
        self._inner.connection_lost(exc)

    def _watch(self, data: bytes) -> None:
        """Follow the heads arriving: a head's deadline runs from its first byte to its blank line."""
        seen = self._tail + data
        end = seen.rfind(_HEAD_END)
        if end < 0:
            self._tail = seen[-len(_HEAD_END) + 1:]
            if self._deadline.when is None:
                self._arm()
            return
        self._served, rest = True, seen[end + len(_HEAD_END):]
        self._deadline.stop()
        self._tail = rest[-len(_HEAD_END) + 1:]
        if rest:
            self._arm()

    def _arm(self) -> None:
        bound = min(self._settings.header_timeout_seconds, self._settings.idle_timeout_seconds)
        self._deadline.arm(asyncio.get_running_loop().time() + bound)

    def _expire(self) -> None:
        assert self._transport is not None
        expire(self._transport, self._listener, answering=self._served)
