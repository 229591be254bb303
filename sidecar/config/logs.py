"""``logging``: how log lines are written (``format``) and whether each RPC gets an access line (``access``);
their level stays the top-level ``log_level``.

``text`` (the default) is one human-readable line per record; ``json`` is one JSON object per line
(``sidecar.telemetry.logs``), for log pipelines. The access line (``sidecar.server.interceptors.access``) is
written at INFO when ``access: true``; it is off by default, since one line per RPC costs each call more than
the rest of the logging (measured in benchmarks/README.md).
"""

from __future__ import annotations

from enum import StrEnum

from sidecar.config.base import Section

__all__ = ["LogFormat", "LoggingSettings"]


class LogFormat(StrEnum):
    """How each log record is written."""

    TEXT = "text"
    JSON = "json"


class LoggingSettings(Section):
    """The format of the sidecar's log lines and whether RPCs get an access line."""

    format: LogFormat = LogFormat.TEXT
    access: bool = False
