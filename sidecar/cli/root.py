"""The ``toolbooth`` command: the parser built from every command group, and ``main``, which dispatches.

A thin shell over ``sidecar.config``, ``sidecar.bootstrap.serve``, ``sidecar.client.Client`` and the
policy, bundle and store tools: each group module (``serve``, ``tools``, ``batch``, ``mcp_stdio``, ``config``,
``policy``, ``audit``, ``approvals``, ``operations``, ``token``, ``plugin_new``) adds its commands and handlers;
``main`` parses, runs the chosen handler and turns the outcome into an exit code (``sidecar.cli.common`` lists
them); with ``--output json`` a failure, usage errors included, is printed as the JSON error of
``sidecar.cli.output``. A command line whose first word is a command (``COMMANDS``) imports only that command's
group (``serve`` loads no approvals, policy test runner or audit tools); any other (``--help``, no command, an
unknown or abbreviated one, ``--version``) gets every group, so help and usage errors list every command.

Ctrl-C ends every command alike, however far it got (loading its modules, starting a sidecar, waiting for
one): ``toolbooth: interrupted`` on stderr (with ``--output json``, the JSON error of code ``INTERRUPTED``) and
exit 130, as a shell reports a command SIGINT ended, never a traceback. So that this holds from the start, this
module imports nothing of the sidecar's at import time: ``main`` does, once it can catch the interrupt.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["COMMANDS", "EXIT_BROKEN_PIPE", "EXIT_INTERRUPTED", "GROUPS", "build_parser", "groups", "main"]

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a command killed by SIGPIPE
EXIT_INTERRUPTED = 128 + signal.SIGINT  # what a shell reports for a command Ctrl-C ended


# The command group modules of ``sidecar.cli``, in the order ``toolbooth --help`` lists them.
GROUPS = ("serve", "tools", "batch", "mcp_stdio", "config", "policy", "audit", "approvals", "operations", "token",
          "plugin_new")
# Each command of ``toolbooth``, in that order, and the group module that adds it.
COMMANDS = {"serve": "serve", "tools": "tools", "call": "tools", "call-batch": "batch", "mcp-stdio": "mcp_stdio",
            "config": "config", "policy": "policy", "audit": "audit", "previews": "approvals",
            "approve": "approvals", "deny": "approvals", "operations": "operations", "token": "token",
            "plugin": "plugin_new"}


def groups(command: str | None = None) -> tuple[ModuleType, ...]:
    """The group module that adds ``command`` when it is one of ``COMMANDS``, else every group, in help order."""
    names = (COMMANDS[command],) if command in COMMANDS else GROUPS
    # ``__import__``, not ``importlib.import_module``: ``python -X importtime`` shows only the former's imports.
    return tuple(__import__(f"sidecar.cli.{name}", fromlist=["add_commands"]) for name in names)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolbooth`` command; return its exit code (``EXIT_INTERRUPTED`` after Ctrl-C, whenever it came)."""
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        return _run(words)
    except KeyboardInterrupt:
        return _interrupted(words)


def _run(words: list[str]) -> int:
    from sidecar.cli.common import EXIT_USAGE, CommandError, Handler, fail
    from sidecar.cli.output import UsageError, json_errors, json_output, requested_json
    from sidecar.errors import ConfigError

    parser = build_parser(words)
    as_json = requested_json(words)
    token = json_errors.set(as_json)
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE, as_json=True)
    finally:
        json_errors.reset(token)
    handler: Handler = args.handler
    as_json = json_output(args)
    try:
        code = handler(args)
        sys.stdout.flush()  # here, so that a reader gone away (``| head``) is seen here and not at exit
    except BrokenPipeError:
        return _stdout_closed()
    except CommandError as exc:
        return fail(str(exc), exc.exit_code, as_json=as_json, name=exc.code)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE, as_json=as_json, name="CONFIG")
    return _interrupted(words) if code == EXIT_INTERRUPTED else code  # one that caught Ctrl-C itself says so alike


def _interrupted(words: list[str]) -> int:
    """Ctrl-C: one line on stderr (what was under way when it came would only be noise), the JSON error of
    ``sidecar.cli.output`` when the command line asked for ``--output json``."""
    from sidecar.cli.output import error_document, requested_json  # the standard library's only

    line = error_document("interrupted", EXIT_INTERRUPTED, "INTERRUPTED") if requested_json(words) else None
    print(line or "toolbooth: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _stdout_closed() -> int:
    """The reader of stdout went away (``toolbooth audit tail | head``): stop quietly, as a command killed by
    SIGPIPE would, with that exit status; stdout goes to /dev/null so that nothing fails at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def build_parser(words: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser of every command; of the group of the first of ``words`` alone when that is a command
    (what it prints is the same: the top level's usage names no command, only its help and an invalid choice do)."""
    from sidecar import __version__
    from sidecar.cli.output import OUTPUT_EPILOG, Parser

    parser = Parser(prog="toolbooth", description="Policy-as-code sidecar for AI-agent tool calls.",
                    epilog=OUTPUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"toolbooth {__version__}",
                        help="print the version of the installed toolbooth package and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in groups(words[0] if words else None):
        group.add_commands(commands)
    return parser
