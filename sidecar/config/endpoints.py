"""The sidecar's HTTP endpoints beside gRPC, as the configuration sees them: one row each (``ENDPOINTS``).

A row names the ``Settings`` section whose ``listen`` turns the endpoint on (``mcp`` → ``mcp.listen``) and says:

- whether it may listen beyond loopback in auth mode ``dev`` (``dev_off_loopback``): only an endpoint that
  serves no tool API and trusts no caller may (metrics, like the health-only listener);
- which of ``server.workers`` serves it (``Workers``);
- the extra its web stack needs and the modules that extra installs (``check_installed``).

``Settings`` (its dev-mode rule, the ports per worker), ``sidecar.server.worker_plan``, ``sidecar.server.http_guard``
and ``sidecar.cli.preflight`` read this table; ``sidecar.server.endpoints`` holds, by the same names, how each
is built and in which order it starts and stops. A new endpoint is a section, one row here and one there.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from sidecar.config.http import HttpConnectionSettings
from sidecar.config.http_json import CALL_PATH
from sidecar.config.mcp import MCP_PATH
from sidecar.config.metrics import METRICS_PATH
from sidecar.errors import ConfigError

__all__ = ["ENDPOINTS", "EndpointRow", "ListenSection", "Workers", "check_installed"]


class ListenSection(Protocol):
    """What every endpoint's section has: where it listens (``None``: off) and the bounds of its clients."""

    @property
    def listen(self) -> str | None: ...

    @property
    def http(self) -> HttpConnectionSettings: ...


class Workers(Enum):
    """Which of ``server.workers`` processes serve an endpoint (``sidecar.server.worker_plan``)."""

    FIRST = "worker 0 only"  # its sessions live in one process's memory
    SHARED = "every worker, on one port (SO_REUSEPORT)"  # stateless: any worker answers any request
    PORT_EACH = "every worker, on the configured port + its index"  # each answers for itself (its own counters)


@dataclass(frozen=True)
class EndpointRow:
    """One endpoint: its section, its dev-mode rule, its workers, the extra it needs."""

    section: str  # the Settings field, e.g. "mcp"
    title: str  # for messages: "serving {title} needs ..."
    workers: Workers
    dev_off_loopback: bool = False
    extra: str | None = None  # None: the base install serves it
    modules: tuple[str, ...] = ()  # what the extra installs, found or not by importlib
    path: str = "/"  # where a client addresses it, for the summary of config validate

    @property
    def key(self) -> str:
        """The key that turns it on."""
        return f"{self.section}.listen"

    def settings(self, settings: object) -> ListenSection:
        """Its section of ``settings`` (a ``Settings``)."""
        section: ListenSection = getattr(settings, self.section)
        return section

    def listen(self, settings: object) -> str | None:
        """Where it listens in ``settings``; ``None``: off."""
        return self.settings(settings).listen

    def url(self, settings: object) -> str | None:
        """Its address in ``settings`` (``http://HOST:PORT/PATH``); ``None``: off."""
        listen = self.listen(settings)
        return None if listen is None else f"http://{listen}{self.path}"

    def missing(self) -> list[str]:
        """The modules of its extra that are not installed."""
        return [name for name in self.modules if importlib.util.find_spec(name) is None]


_WEB = ("starlette", "uvicorn", "h11")  # the web stack of sidecar.server.http_limits
ENDPOINTS = (  # in the order they start, in their phase (sidecar.server.endpoints: around or within gRPC)
    EndpointRow("mcp", "MCP", Workers.FIRST, extra="mcp", modules=("mcp", *_WEB), path=MCP_PATH),
    EndpointRow("approvals_ui", "the approval inbox", Workers.FIRST, extra="approvals-ui",
                modules=(*_WEB, "jinja2")),
    EndpointRow("http_json", "HTTP/JSON", Workers.SHARED, extra="http-json", modules=_WEB, path=CALL_PATH),
    EndpointRow("metrics", "metrics", Workers.PORT_EACH, dev_off_loopback=True, path=METRICS_PATH),
)


def check_installed(settings: object) -> None:
    """``ConfigError`` naming the key of the first endpoint that is on in ``settings`` without its extra."""
    for row in ENDPOINTS:
        if row.extra is not None and row.listen(settings) is not None and (missing := row.missing()):
            raise ConfigError(f"config error at {row.key}: serving {row.title} needs the '{row.extra}' extra "
                              f"(pip install 'toolbooth[{row.extra}]'); missing: {', '.join(missing)}")
