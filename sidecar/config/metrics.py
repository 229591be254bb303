"""``metrics``: Prometheus metrics at ``http://HOST:PORT/metrics`` (``sidecar.metrics``), off unless ``listen`` is set.

``listen`` is one TCP address (``HOST:PORT``, ``[IPV6]:PORT``; port 0 for any free port). The endpoint
answers scrapes only, without authentication, and serves no tool API: like the health-only listener it
may listen beyond loopback in dev mode, for a Prometheus that scrapes the pod's address. ``http`` bounds its
clients' time and number (``sidecar.config.http``; 32 connections by default: a scraper or two need few).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from sidecar.config.base import Section
from sidecar.config.http import HttpConnectionSettings
from sidecar.config.listen import Endpoint, ListenKind, parse_listen

__all__ = ["METRICS_PATH", "MetricsSettings"]

METRICS_PATH = "/metrics"


class MetricsSettings(Section):
    """Where the metrics endpoint listens (``None``: nowhere, the default: nothing is counted)."""

    listen: str | None = None
    http: HttpConnectionSettings = Field(default_factory=lambda: HttpConnectionSettings(max_connections=32))

    @field_validator("listen")
    @classmethod
    def _one_tcp_address(cls, value: str | None) -> str | None:
        if value is not None:
            address = parse_listen(value)
            if address.kind is not ListenKind.TCP or len(address.endpoints) != 1:
                raise ValueError(f"{value!r}: the metrics endpoint listens on one TCP address, HOST:PORT or "
                                 "[IPV6]:PORT")
        return value

    @property
    def endpoint(self) -> Endpoint | None:
        """The host and port to listen on, ``None`` when metrics are off."""
        return None if self.listen is None else parse_listen(self.listen).endpoints[0]
