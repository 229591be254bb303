"""What each of ``server.workers`` processes serves: its settings, and the TCP ports the supervisor holds for them.

Every worker is a whole sidecar (its own pipeline, store connections and policy engine) with the same
settings except where it listens:

- ``server.listen`` and ``server.health_listen``: the same TCP ports in every worker, shared with
  ``SO_REUSEPORT``; a port 0 is chosen once, here, so that all of them bind the same one. The supervisor
  holds each port (``reserve_port``) for as long as it runs, so it stays theirs while a worker restarts.
- ``metrics.listen``: a port per worker, since each counts its own calls: worker ``i`` on the configured
  port + ``i`` (port 0: any free port each, logged).
- ``mcp.listen`` and ``approvals_ui``: worker 0 only. Their sessions (an MCP session, an inbox sign-in) live
  in one process's memory, so a port shared by several would answer a session's next request from a
  process that does not know it.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass, field

from sidecar.config import Settings, parse_listen, parse_settings

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

    @classmethod
    def reserve(cls, settings: Settings) -> WorkerPlan:
        """Hold every TCP port of ``server.listen`` and ``server.health_listen``; ``OSError`` ``cannot listen on
        ADDRESS: <reason>`` (nothing held) when one cannot be."""
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
            return cls(settings, listen, hold(health)[0] if health is not None else None, held)
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
        """Worker ``index``'s settings: the reserved ports, its own metrics port, MCP and the inbox in worker 0."""
        raw = self.settings.model_dump(exclude_none=True)
        raw["server"]["listen"] = list(self.listen)
        if self.health_listen is not None:
            raw["server"]["health_listen"] = self.health_listen
        endpoint = self.settings.metrics.endpoint
        if endpoint is not None and endpoint.port:
            raw["metrics"]["listen"] = f"{endpoint.host}:{endpoint.port + index}"
        if index > 0:
            raw["mcp"].pop("listen", None)
            raw.pop("approvals_ui", None)
        return parse_settings(raw, origins=self.settings.origins)
