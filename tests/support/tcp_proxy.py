"""A TCP proxy on 127.0.0.1 that can go silent, as a network partition does: no error, no reset, nothing.

While ``stalled``, bytes in either direction are held, not forwarded (the peers' kernels still
acknowledge them, so only a timeout of the application notices). ``resume`` lets them through again.
``cut`` is a server restarting instead: every connection is reset and new ones are refused (the
port stops listening) until ``restore``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["StallingProxy"]


class StallingProxy:
    """Forwards each connection accepted on ``port`` to ``upstream``; ``stall``/``resume`` for all of them."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.port = upstream, 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._closed = False

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, upstream: tuple[str, int]) -> AsyncIterator[StallingProxy]:
        proxy = cls(upstream)
        proxy._server = await asyncio.start_server(proxy._accept, "127.0.0.1", 0)
        proxy.port = proxy._server.sockets[0].getsockname()[1]
        try:
            yield proxy
        finally:
            proxy._closed = True  # a connection accepted from now on is closed at once
            proxy._server.close()
            for pipe in list(proxy._pipes):
                pipe.cancel()
            await asyncio.gather(*proxy._pipes, return_exceptions=True)
            while proxy._writers:  # every socket closed, and seen closed, before the loop ends
                writer = proxy._writers.pop()
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()
            await proxy._server.wait_closed()

    def stall(self) -> None:
        self._flowing.clear()

    def cut(self) -> None:
        """Reset every connection (RST, as a killed server's) and refuse new ones until ``restore``."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()

    async def restore(self) -> None:
        """Listen on the same port again."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def resume(self) -> None:
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:
            writer.close()
            return
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        if self._closed:  # closed while connecting upstream: the clean-up has already run
            writer.close()
            up_writer.close()
            return
        self._writers.append(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.close()
