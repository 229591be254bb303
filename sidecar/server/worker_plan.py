"""What each of ``server.workers`` processes serves: its settings, and the TCP ports the supervisor holds for them.

Every worker is a whole sidecar (its own pipeline, store connections and policy engine) with the same
settings except where it listens:

- ``server.listen`` and ``server.health_listen``: the same TCP ports in every worker, shared with
  ``SO_REUSEPORT``; a port 0 is chosen once, here, so that all of them bind the same one. The supervisor
  holds each port (``reserve_port``) for as long as it runs, so it stays theirs while a worker restarts.
- each HTTP endpoint as its row of ``sidecar.config.endpoints`` says (``Workers``):

  - ``PORT_EACH`` (``metrics.listen``): a port per worker, since each counts its own calls: worker ``i`` on the
    configured port + ``i`` (port 0: any free port each, logged);
  - ``FIRST`` (``mcp.listen``, ``approvals_ui.listen``): worker 0 only. Their sessions (an MCP session, an inbox
    sign-in) live in one process's memory, so a port shared by several would answer a session's next request
    from a process that does not know it;
  - ``SHARED`` (``http_json.listen``): every worker on one port, held and shared as ``server.listen``'s, since a
    request needs nothing a previous one left behind.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass, field

from sidecar.config import Settings, parse_listen, parse_settings
from sidecar.config.endpoints import ENDPOINTS, Workers

__all__ = ["WorkerJob", "WorkerPlan"]


@dataclass(frozen=True)
class WorkerJob:
    """What the supervisor sends a worker process (``sidecar.cli.serve_worker``): its index and its settings."""

    index: int
    settings: Settings


@dataclass
class WorkerPlan:
    """The listen addresses every worker binds, as reserved, and the sockets holding them (``close`` frees them)."""

    settings: Settings
    listen: tuple[str, ...]
    health_listen: str | None
    _held: list[socket.socket] = field(default_factory=list)
    shared: dict[str, str] = field(default_factory=dict)  # an endpoint's section -> its address, as reserved

    @classmethod
    def reserve(cls, settings: Settings) -> WorkerPlan:
        """Hold every TCP port of ``server.listen``, ``server.health_listen`` and the endpoints every worker shares;
        ``OSError`` ``cannot listen on ADDRESS: <reason>`` (nothing held) when one cannot be."""
        from sidecar.server.listeners import reserve_port

        held: list[socket.socket] = []

        def hold(text: str) -> list[str]:
            bound = []
            for endpoint in parse_listen(text).endpoints:
                sock = reserve_port(text, endpoint.host.removeprefix("[").removesuffix("]"), endpoint.port)
                held.append(sock)
                bound.append(f"{endpoint.host}:{sock.getsockname()[1]}")
            return bound

        try:
            listen = tuple(bound for text in settings.server.listen for bound in hold(text))
            health = settings.server.health_listen
            shared = {row.section: hold(text)[0] for row in ENDPOINTS
                      if row.workers is Workers.SHARED and (text := row.listen(settings)) is not None}
            return cls(settings, listen, hold(health)[0] if health is not None else None, held, shared)
        except BaseException:
            for sock in held:
                sock.close()
            raise

    def close(self) -> None:
        """Free the ports (once the workers are gone)."""
        for sock in self._held:
            with contextlib.suppress(OSError):
                sock.close()
        self._held.clear()

    def settings_for(self, index: int) -> Settings:
        """Worker ``index``'s settings: the reserved ports, and each endpoint's address as its row says."""
        raw = self.settings.model_dump(exclude_none=True)
        raw["server"]["listen"] = list(self.listen)
        if self.health_listen is not None:
            raw["server"]["health_listen"] = self.health_listen
        for row in ENDPOINTS:
            if (listen := row.listen(self.settings)) is not None:
                _place(raw[row.section], row.workers, listen, index, self.shared.get(row.section))
        return parse_settings(raw, origins=self.settings.origins)


def _place(section: dict[str, object], workers: Workers, listen: str, index: int, shared: str | None) -> None:
    """Set (or drop) the ``listen`` of an endpoint's ``section`` for worker ``index``."""
    if workers is Workers.FIRST and index > 0:
        del section["listen"]
    elif workers is Workers.SHARED and shared is not None:
        section["listen"] = shared
    elif workers is Workers.PORT_EACH:
        endpoint = parse_listen(listen).endpoints[0]
        if endpoint.port:
            section["listen"] = f"{endpoint.host}:{endpoint.port + index}"
