"""``isolation``: sync handlers that run in worker processes of their plugin, stopped at their deadline.

Opt-in, by plugin (``plugins``: entry-point or distribution names, as in ``plugins.allow``; every
sync tool of the plugin) or by tool (``tools``). The names are checked against the loaded tools
when the plugins load (``sidecar.tools.isolation.plan``), not here: an unknown name, an async tool
or a handler a worker cannot import by its path is a ``ConfigError`` naming it.
"""

from __future__ import annotations

from pydantic import Field

from sidecar.config.base import Section

__all__ = ["IsolationSettings"]


class IsolationSettings(Section):
    """``workers_per_plugin``: the processes of each isolated plugin (started with the sidecar), so the calls
    of its isolated tools that run at once; ``stop_grace_seconds``: how long a worker stopped at a deadline
    (or at shutdown) has after SIGTERM before it is killed."""

    plugins: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    workers_per_plugin: int = Field(default=2, gt=0, le=64)
    stop_grace_seconds: float = Field(default=0.5, ge=0, le=10)
