"""JSON log lines (``logging.format: json``) on stderr; text lines are ``sidecar.cli.common.setup_logging``'s.

Every logger of the process is a stdlib logger (the sidecar's, its plugins', its libraries'); with ``json``
the root handler formats each record with structlog's ``ProcessorFormatter``: one JSON object per line with
``timestamp`` (UTC, ISO 8601), ``level``, ``logger``, ``event`` (the message), the record's ``extra`` fields,
the fields of the call it was written during (``sidecar.telemetry.call_log``) and ``exception`` (its
traceback) if any. structlog's own loggers, for plugins that use them, are routed through the same handler,
their level checked before any processor runs. A record below the level is dropped by ``logging`` before
any of this, so it costs nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from structlog.typing import Processor

from sidecar.telemetry.call_log import call_fields

__all__ = ["json_formatter", "setup_json_logging"]


def setup_json_logging(level: str) -> None:
    """Log records at ``level`` and above to stderr as JSON lines; replaces any earlier setup."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(json_formatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    wrap = structlog.stdlib.ProcessorFormatter.wrap_for_formatter
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *_fields(), wrap],
        logger_factory=structlog.stdlib.LoggerFactory(), wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True)


def json_formatter() -> logging.Formatter:
    """The formatter of JSON lines: every stdlib record (and structlog's) as one JSON object."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *_fields()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer(default=str)],
        use_get_message=True)


def _fields() -> list[Processor]:
    """What every line gets: time, level, logger and the call's fields."""
    processors: list[Any] = [structlog.processors.TimeStamper(fmt="iso", utc=True), structlog.stdlib.add_log_level,
                             structlog.stdlib.add_logger_name, call_fields]
    return processors
