"""``toolbooth tools list``, ``tools export`` and ``toolbooth call``: an agent's requests, from the command line.

``tools export --format openai|anthropic|mcp`` prints the tools this caller may see (the sidecar's
listing, so its policies decide) as a JSON list of that provider's tool objects
(``sidecar.api.schemas``); for ``openai``, each tool whose schema cannot take strict mode is named on
stderr with the reason.

``call`` sends the ``--args`` text unparsed, because the sidecar is the validator; only text that
is not JSON at all is refused here, as a usage error saying where it breaks. Its exit code
follows the result's status (see ``CALL_EPILOG``).
"""

from __future__ import annotations

import argparse
import sys

from sidecar.api.schemas import SchemaFormat, strict_problem, tool_schemas
from sidecar.cli.common import (
    EXIT_APPROVAL_REQUIRED,
    EXIT_OK,
    EXIT_TOOL_ERROR,
    Subparsers,
    client_flags,
    dump_json,
    field_flag,
    print_result,
    read_arguments,
    valid_json,
    with_client,
)
from sidecar.cli.flags import positive_seconds
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.table import Column, render_table
from sidecar.contract import Status, ToolListing

__all__ = ["CALL_EPILOG", "add_commands", "cmd_call", "cmd_tools_export", "cmd_tools_list", "exit_code",
           "format_table", "strict_notes"]

_STATUS_EXIT: dict[Status, int] = {
    Status.SUCCESS: EXIT_OK,
    Status.PARTIAL_SUCCESS: EXIT_OK,
    Status.ERROR: EXIT_TOOL_ERROR,
    Status.APPROVAL_REQUIRED: EXIT_APPROVAL_REQUIRED,
}

CALL_EPILOG = """\
The result is printed as JSON (with --field, only that field). Exit codes:
  0  status success or partial_success
  1  the request failed (gRPC error, e.g. the sidecar is not running), or the result has no --field
  2  usage error (e.g. an unreadable --args file, or --args that is not JSON)
  3  status error (see error.code, error.recovery)
  4  status approval_required (an approver must approve the preview first)
"""


def add_commands(commands: Subparsers) -> None:
    """Add ``tools list`` and ``call`` to the ``toolbooth`` parser."""
    tools = commands.add_parser("tools", help="discover tools")
    actions = tools.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list the tools this caller may use")
    client_flags(listing)
    output_flag(listing, "table")
    listing.set_defaults(handler=cmd_tools_list)
    export = actions.add_parser("export", help="print the tools this caller may use as a model provider's tools")
    export.add_argument("--format", required=True, choices=[f.value for f in SchemaFormat],
                        help="openai (function tools, strict where the schema allows), anthropic or mcp")
    export.add_argument("--conversation-id", metavar="ID", help="the conversation the listing is for")
    output_flag(export, None)
    client_flags(export)
    export.set_defaults(handler=cmd_tools_export)
    call = commands.add_parser("call", help="execute one tool call", epilog=CALL_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("--args", dest="arguments", default="{}", metavar="JSON",
                      help="arguments as a JSON object, @FILE to read a file, - to read stdin (default: {})")
    call.add_argument("--idempotency-key", metavar="KEY", help="required by tools with side effects")
    call.add_argument("--conversation-id", metavar="ID")
    call.add_argument("--approval-id", metavar="ID", help="the preview_id of an approved preview of this exact call")
    client_flags(call)
    call.add_argument("--timeout", type=positive_seconds, metavar="SECONDS", help="deadline of the call (more than 0)")
    field_flag(call, "data.preview_id")
    output_flag(call, None)
    call.set_defaults(handler=cmd_call)


def cmd_tools_list(args: argparse.Namespace) -> int:
    """``toolbooth tools list``: print the tools this caller may use."""
    listing = with_client(args, lambda client: client.list_tools())
    print(dump_json(listing.model_dump(mode="json")) if json_output(args) else format_table(listing))
    return EXIT_OK


def cmd_tools_export(args: argparse.Namespace) -> int:
    """``toolbooth tools export``: the tools this caller may use, as ``--format`` tool objects."""
    listing = with_client(args, lambda client: client.list_tools(conversation_id=args.conversation_id))
    print(dump_json(tool_schemas(listing.tools, args.format)))
    if args.format == SchemaFormat.OPENAI:
        for note in strict_notes(listing):
            print(f"toolbooth: note: {note}", file=sys.stderr)
    return EXIT_OK


def strict_notes(listing: ToolListing) -> list[str]:
    """One line for each tool exported without OpenAI's strict mode, saying why."""
    return [f"tool {tool.name!r} is not strict: {problem}" for tool in listing.tools
            if (problem := strict_problem(tool.input_schema)) is not None]


def cmd_call(args: argparse.Namespace) -> int:
    """``toolbooth call``: execute one call and print its typed result."""
    arguments = valid_json(read_arguments(args.arguments))
    result = with_client(args, lambda client: client.execute(
        args.tool, arguments, idempotency_key=args.idempotency_key, approval_id=args.approval_id,
        conversation_id=args.conversation_id, timeout=args.timeout))
    print_result(result.model_dump(mode="json"), args.field, as_json=json_output(args))
    return exit_code(result.status)


def exit_code(status: Status) -> int:
    """The exit code of ``toolbooth call`` for a result with ``status``."""
    return _STATUS_EXIT[status]


def format_table(listing: ToolListing) -> str:
    """The tools as an aligned table (``sidecar.cli.table``)."""
    columns = (Column("NAME"), Column("VERSION", wrap=False), Column("SIDE EFFECT"), Column("KEY REQUIRED"),
               Column("TIMEOUT", wrap=False))
    return render_table(columns, [(t.name, t.version, t.side_effect.value,
                                   "yes" if t.requires_idempotency_key else "no", f"{t.timeout_ms / 1000:g}s")
                                  for t in listing.tools])
