"""``toolbooth call-batch FILE``: the calls of one model reply, run as one ``ExecuteToolBatch``.

FILE (``-``: stdin) holds the calls as a JSON array of call objects, or as JSON Lines, one call object
per line (blank lines are skipped). A call object has ``tool`` and, optionally, ``arguments`` (any JSON
value, sent as its JSON text: the sidecar validates it, as ``call`` leaves ``--args`` to it),
``idempotency_key``, ``approval_id``, ``conversation_id`` and ``call_id`` (strings). A file that is not
such a list of calls is a usage error naming the line or the call and what is wrong with it; nothing is
sent then. The results are printed as a JSON array, in the order of the calls; the exit code is that of
``call`` for the worst of them (see ``CALL_BATCH_EPILOG``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.cli.common import (
    EXIT_APPROVAL_REQUIRED,
    EXIT_OK,
    EXIT_TOOL_ERROR,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    client_flags,
    dump_json,
    with_client,
)
from sidecar.cli.flags import positive_seconds
from sidecar.cli.output import output_flag
from sidecar.contract import Status

if TYPE_CHECKING:
    from sidecar.contract import CallRequest

__all__ = ["CALL_BATCH_EPILOG", "CALL_FIELDS", "add_commands", "batch_exit_code", "cmd_call_batch", "read_calls"]

CALL_FIELDS = ("tool", "arguments", "idempotency_key", "approval_id", "conversation_id", "call_id")

CALL_BATCH_EPILOG = """\
FILE holds a JSON array of calls, or one call per line (JSON Lines); a call is an object:
  {"tool": "echo", "arguments": {"text": "hi"}, "idempotency_key": "k-1", "call_id": "c-1"}
(only "tool" is required; also "approval_id", "conversation_id").
The results are printed as a JSON array, in the order of the calls. Exit codes:
  0  every result has status success or partial_success
  1  the request failed (gRPC error, e.g. the sidecar is not running, or more calls than it takes)
  2  usage error (an unreadable FILE, or one that is not a list of calls)
  3  some result has status error (see its error.code, error.recovery)
  4  no result is an error, but some need approval (status approval_required)
"""


def add_commands(commands: Subparsers) -> None:
    """Add ``call-batch`` to the ``toolbooth`` parser."""
    batch = commands.add_parser("call-batch", help="execute the calls of one model reply as one batch",
                                epilog=CALL_BATCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch.add_argument("file", metavar="FILE", help="the calls: a JSON array or JSON Lines; - reads stdin")
    batch.add_argument("--max-concurrency", type=int, default=0, metavar="N",
                       help="calls running at once (default 0: the sidecar's limits.max_batch_concurrency, "
                            "which also caps it)")
    batch.add_argument("--cancel-on-permanent-failure", action="store_true",
                       help="the first permanent failure cancels the calls still waiting or running "
                            "(a started write always finishes)")
    client_flags(batch)
    batch.add_argument("--timeout", type=positive_seconds, metavar="SECONDS",
                       help="deadline of the whole batch (more than 0)")
    output_flag(batch, None)
    batch.set_defaults(handler=cmd_call_batch)


def cmd_call_batch(args: argparse.Namespace) -> int:
    """``toolbooth call-batch``: run the calls of FILE as one batch and print their results."""
    if args.max_concurrency < 0:
        raise CommandError("--max-concurrency must be 0 or more", EXIT_USAGE)
    calls = read_calls(args.file)
    results = with_client(args, lambda client: client.execute_batch(
        calls, max_concurrency=args.max_concurrency, cancel_on_permanent_failure=args.cancel_on_permanent_failure,
        timeout=args.timeout))
    print(dump_json([result.model_dump(mode="json") for result in results]))
    return batch_exit_code([result.status for result in results])


def batch_exit_code(statuses: list[Status]) -> int:
    """The exit code of ``call-batch``: that of ``call`` for the worst status (error, then approval_required)."""
    if Status.ERROR in statuses:
        return EXIT_TOOL_ERROR
    if Status.APPROVAL_REQUIRED in statuses:
        return EXIT_APPROVAL_REQUIRED
    return EXIT_OK


def read_calls(file: str) -> list[CallRequest]:
    """The calls of ``file`` (``-``: stdin); a usage error saying where and why for anything else."""
    name = "stdin" if file == "-" else file
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CommandError(f"cannot read {name}: {reason}", EXIT_USAGE) from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        entries = _json_lines(text, name)  # not one JSON document: JSON Lines
    else:
        entries = [(f"calls[{i}]", entry) for i, entry in enumerate(whole)] if isinstance(whole, list) \
            else [("line 1", whole)]
    if not entries:
        raise CommandError(f"{name}: no calls", EXIT_USAGE)
    return [_call(f"{name}: {where}", entry) for where, entry in entries]


def _json_lines(text: str, name: str) -> list[tuple[str, Any]]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entries.append((f"line {number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise CommandError(f"{name}: line {number} is not valid JSON: {exc.msg} at column {exc.colno} (FILE holds "
                               "a JSON array of calls or one call per line)", EXIT_USAGE) from None
    return entries


def _call(where: str, entry: Any) -> CallRequest:
    from sidecar.client import call_request  # gRPC loads only for commands that talk to a sidecar

    if not isinstance(entry, dict):
        raise CommandError(f"{where}: a call must be a JSON object, got {type(entry).__name__}", EXIT_USAGE)
    unknown = sorted(set(entry) - set(CALL_FIELDS))
    if unknown:
        raise CommandError(f"{where}: unknown key {unknown[0]!r} (a call has {', '.join(CALL_FIELDS)})", EXIT_USAGE)
    tool = entry.get("tool")
    if not isinstance(tool, str) or not tool:
        raise CommandError(f"{where}: \"tool\" must be a non-empty string", EXIT_USAGE)
    fields = {name: entry.get(name) for name in CALL_FIELDS[2:]}
    for field_name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise CommandError(f"{where}: {field_name!r} must be a string", EXIT_USAGE)
    arguments = json.dumps(entry.get("arguments", {}), separators=(",", ":"), ensure_ascii=False)
    return call_request(tool, arguments, **fields)
