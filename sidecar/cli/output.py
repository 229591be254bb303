"""``--output``: the one flag that picks what a command prints, and what a failure prints with ``--output json``.

Every ``toolbooth`` command that prints a result takes ``--output``: its human form (``text`` or ``table``, the
default) or ``json``, one JSON document on stdout (JSON Lines, one object a line, for ``audit tail`` and
``audit export``, which stream). Commands whose result is JSON already accept ``--output json`` too, so a
script can pass it everywhere. ``serve`` and ``mcp-stdio`` print no result (``NO_RESULT``).

With ``--output json`` a failure is one line on stderr, ``{"error": {"code": ..., "message": ...,
"exit_code": N}}``, with the exit code it has without it; ``code`` is ``USAGE``, ``CONFIG``, ``FAILURE``,
``REFUSED``, ``INTERRUPTED`` (Ctrl-C, exit 130) or the gRPC status of a failed request (``UNAVAILABLE``,
``UNAUTHENTICATED``, ...).
"""

from __future__ import annotations

import argparse
import contextvars
import itertools
import json
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["ERROR_CODES", "JSON", "NO_RESULT", "OUTPUT_EPILOG", "Parser", "UsageError", "error_document", "json_errors",
           "json_output", "output_flag", "requested_json"]

JSON = "json"

# The commands that print no result: what ``--output`` would choose does not exist for them.
NO_RESULT = {"serve": "runs the sidecar: it prints logs (logging.format: json), no result",
             "mcp-stdio": "stdout carries the MCP protocol itself"}

OUTPUT_EPILOG = """\
Every command that prints a result takes --output json: one JSON document on stdout (JSON Lines for
audit tail and audit export); a failure is then one JSON object on stderr,
  {"error": {"code": "USAGE", "message": "...", "exit_code": 2}}
with the same exit code. Long commands show progress on stderr when it is a terminal (not with
--no-progress, TOOLBOOTH_NO_PROGRESS=1 or TERM=dumb).
"""

ERROR_CODES = {1: "FAILURE", 2: "USAGE", 3: "REFUSED", 4: "APPROVAL_REQUIRED"}

# Set by ``main`` while it parses a command line that asks for JSON: usage errors are then raised, not printed.
json_errors: contextvars.ContextVar[bool] = contextvars.ContextVar("json_errors", default=False)


class UsageError(Exception):
    """A usage error of a command line that asked for ``--output json``."""


class Parser(argparse.ArgumentParser):
    """``argparse``'s parser, whose usage errors ``main`` prints as JSON when the command line asks for it."""

    def error(self, message: str) -> NoReturn:
        if json_errors.get():
            raise UsageError(f"{self.prog}: {message}")
        super().error(message)


def output_flag(parser: argparse.ArgumentParser, human: str | None = "text", *, json_alias: bool = False) -> None:
    """``--output HUMAN|json`` (default ``HUMAN``); for a command whose result is always JSON (``human`` is
    ``None``), ``--output json`` only; ``json_alias`` adds ``--json``, an older spelling of ``--output json``."""
    choices = (JSON,) if human is None else (human, JSON)
    parser.add_argument("--output", choices=choices, default=human,
                        help=f"{' or '.join(choices)} (default: {human or JSON})")
    if json_alias:
        parser.add_argument("--json", dest="output", action="store_const", const=JSON,
                            help="the same as --output json")


def json_output(args: argparse.Namespace) -> bool:
    """Whether the command was given ``--output json`` (or ``--json``)."""
    return getattr(args, "output", None) == JSON


def requested_json(argv: Sequence[str]) -> bool:
    """Whether a command line asks for ``--output json``, before it is parsed (for its usage errors)."""
    words = list(argv)
    return ("--json" in words or "--output=json" in words
            or any(a == "--output" and b == JSON for a, b in itertools.pairwise(words)))


def error_document(message: str, exit_code: int, code: str | None = None) -> str:
    """The one-line JSON object a failure prints on stderr with ``--output json``."""
    error: dict[str, Any] = {"code": code or ERROR_CODES.get(exit_code, "FAILURE"), "message": message,
                             "exit_code": exit_code}
    return json.dumps({"error": error}, ensure_ascii=False)
