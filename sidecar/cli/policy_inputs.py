"""What ``toolbooth policy eval`` reads from its flags: the principal, the history, the time."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sidecar.cli.common import EXIT_USAGE, CommandError
from sidecar.contract import Principal
from sidecar.pipeline.history import GivenHistory

__all__ = ["read_history", "read_principal", "utc_time"]

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def read_principal(path: Path) -> Principal:
    """The principal in JSON file ``path``."""
    try:
        return Principal.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"cannot read --principal file {path}: {exc.strerror}", EXIT_USAGE) from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())
        raise CommandError(f"--principal file {path} is not a principal: {problems}", EXIT_USAGE) from None


def read_history(path: Path) -> dict[str, Any]:
    """The history in JSON file ``path`` (``--history``), checked."""
    try:
        return GivenHistory.read(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"cannot read --history file {path}: {exc.strerror}", EXIT_USAGE) from None
    except ValueError as exc:
        raise CommandError(f"--history file {path} is not a call history: {exc}", EXIT_USAGE) from None


def utc_time(value: str) -> str:
    """An ``--time`` value: RFC 3339 in UTC, to the second, as the sidecar writes ``input.context.time``."""
    try:
        dt.datetime.strptime(value, _TIME_FORMAT)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a UTC time like 2026-11-30T15:00:00Z, got {value!r}") from None
    return value
