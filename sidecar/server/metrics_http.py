"""The metrics endpoint (``metrics.listen``): ``GET /metrics`` in Prometheus's text format, on the sidecar's loop.

aiohttp serves prometheus_client's own handler (``make_aiohttp_handler``: the exposition format the
scraper asks for, OpenMetrics included, compressed when it accepts gzip) over one sidecar's registry.
The socket is bound first with ``tcp_socket``, so a port in use fails at start with ``cannot listen on
metrics.listen ...: <reason>``. A scrape is answered between two steps of the calls in flight; it reads
counters and needs no lock the calls hold. ``metrics.http`` bounds its clients: aiohttp's protocol is served
through ``sidecar.server.http_guard.guarded`` (a cap on connections, a deadline on each request head), its
keep-alive timer closes an idle connection.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from sidecar.config import METRICS_PATH, MetricsSettings
from sidecar.server.http_guard import guarded
from sidecar.server.listeners import tcp_socket

__all__ = ["MetricsEndpoint"]

log = logging.getLogger(__name__)


class MetricsEndpoint:
    """The metrics endpoint of one sidecar: its socket bound when made (``OSError`` ``cannot listen on …`` if it
    cannot be), then ``start`` and ``stop`` (each once)."""

    def __init__(self, registry: CollectorRegistry, metrics: MetricsSettings) -> None:
        endpoint = metrics.endpoint
        assert endpoint is not None, "metrics.listen is not set"
        self._socket = tcp_socket(f"metrics.listen {metrics.listen}", endpoint.host.removeprefix("[")
                                  .removesuffix("]"), endpoint.port)
        app = web.Application()
        app.router.add_get(METRICS_PATH, make_aiohttp_handler(registry))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0,
                                     keepalive_timeout=metrics.http.idle_timeout_seconds)
        self._http = metrics.http
        self._server: asyncio.Server | None = None
        self.url = f"http://{endpoint.host}:{self._socket.getsockname()[1]}{METRICS_PATH}"

    async def start(self) -> None:
        """Serve on this loop; returns once it accepts connections."""
        try:
            await self._runner.setup()
            assert self._runner.server is not None
            factory = guarded(self._runner.server, "metrics", self._http)
            self._server = await asyncio.get_running_loop().create_server(factory, sock=self._socket)
        except BaseException:
            await self.stop()
            raise
        log.info("metrics (Prometheus) on %s", self.url)

    async def stop(self) -> None:
        """Stop listening and close the connections (a scrape in progress ends first)."""
        if self._server is not None:
            self._server.close()
        await self._runner.cleanup()
        self._socket.close()
