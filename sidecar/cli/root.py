"""The ``toolbooth`` command: the parser built from every command group, and ``main``, which dispatches.

A thin shell over ``sidecar.config``, ``sidecar.bootstrap.serve``, ``sidecar.client.Client`` and the
policy, bundle and store tools: each group module (``serve``, ``tools``, ``batch``, ``mcp_stdio``, ``config``,
``policy``, ``audit``, ``approvals``, ``operations``, ``token``) adds its commands and handlers; ``main``
parses, runs the chosen handler and turns the outcome into an exit code (``sidecar.cli.common`` lists them);
with ``--output json`` a failure, usage errors included, is printed as the JSON error of ``sidecar.cli.output``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from sidecar import __version__
from sidecar.cli import approvals, audit, batch, config, mcp_stdio, operations, plugin_new, policy, serve, token, tools
from sidecar.cli.common import EXIT_USAGE, CommandError, Handler, fail
from sidecar.cli.output import OUTPUT_EPILOG, Parser, UsageError, json_errors, json_output, requested_json
from sidecar.errors import ConfigError

__all__ = ["EXIT_BROKEN_PIPE", "GROUPS", "build_parser", "main"]

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a command killed by SIGPIPE

# In the order ``toolbooth --help`` lists them.
GROUPS = (serve, tools, batch, mcp_stdio, config, policy, audit, approvals, operations, token, plugin_new)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolbooth`` command; return its exit code."""
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
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
    return code


def _stdout_closed() -> int:
    """The reader of stdout went away (``toolbooth audit tail | head``): stop quietly, as a command killed by
    SIGPIPE would, with that exit status; stdout goes to /dev/null so that nothing fails at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = Parser(prog="toolbooth", description="Policy-as-code sidecar for AI-agent tool calls.",
                    epilog=OUTPUT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"toolbooth {__version__}",
                        help="print the version of the installed toolbooth package and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_commands(commands)
    return parser
