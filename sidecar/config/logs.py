"""``logging``: how log lines are written (``format``); their level stays the top-level ``log_level``.

``text`` (the default) is one human-readable line per record; ``json`` is one JSON object per line
(``sidecar.telemetry.logs``), for log pipelines.
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
    """The format of the sidecar's log lines."""

    format: LogFormat = LogFormat.TEXT
