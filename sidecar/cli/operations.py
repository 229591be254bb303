"""``toolbooth operations list | resolve``: keyed calls without a result, read from the configured store.

A call whose handler outlived its deadline, or whose sidecar died mid-handler, is ``unknown``: retries get
``OPERATION_IN_PROGRESS`` and it never runs again on its own (a sync handler that ends later stores its own
result). An operator finds out what happened, then settles it with ``resolve --completed``
or ``--failed``; retries with its key then replay that result. Like ``toolbooth audit``, these commands
open the store of ``--config`` directly. Exit codes: 0 done, 1 store unreadable or nothing to resolve.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from sidecar.cli.common import EXIT_FAILURE, EXIT_OK, CommandError, Subparsers, config_flag, dump_json, with_store
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.table import Column, render_table
from sidecar.contract import ErrorCode, ErrorInfo, OperationState, ResultMeta, Status, ToolResult
from sidecar.state import KeyScope, OperationRecord, Store

__all__ = ["RESOLVED_FAILED_MESSAGE", "add_commands", "cmd_list", "cmd_resolve", "record_document", "resolved_result"]

RESOLVED_FAILED_MESSAGE = "resolved as failed by an operator"


def add_commands(commands: Subparsers) -> None:
    """Add ``operations`` and its subcommands to the ``toolbooth`` parser."""
    operations = commands.add_parser("operations", help="keyed calls in progress or of unknown outcome")
    actions = operations.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="keyed calls without a result, oldest first")
    listing.add_argument("--unknown", action="store_true", help="only those of unknown outcome")
    output_flag(listing, "table")
    listing.set_defaults(handler=cmd_list)
    resolve = actions.add_parser("resolve", help="settle a keyed call of unknown outcome; retries replay it")
    resolve.add_argument("key", metavar="KEY", help="its idempotency key")
    resolve.add_argument("--tool", required=True, metavar="T")
    resolve.add_argument("--principal", required=True, metavar="ID", help="the calling principal's id")
    resolve.add_argument("--tenant", default="", metavar="T", help="the calling principal's tenant (default: none)")
    outcome = resolve.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--completed", dest="outcome", action="store_const", const=Status.SUCCESS,
                         help="its effects happened")
    outcome.add_argument("--failed", dest="outcome", action="store_const", const=Status.ERROR,
                         help="its effects did not happen")
    resolve.add_argument("--note", default="", metavar="N", help="why, for whoever reads the result")
    output_flag(resolve)
    resolve.set_defaults(handler=cmd_resolve)
    for parser in (listing, resolve):
        config_flag(parser)


def cmd_list(args: argparse.Namespace) -> int:
    """``toolbooth operations list [--unknown]``: a table, or a JSON array of ``record_document``s."""
    records = [record_document(record) for record in with_store(args.config, lambda store: store.pending_operations())
               if not args.unknown or record.state is OperationState.UNKNOWN]
    if json_output(args):
        print(dump_json(records))
    elif not records:
        print("no keyed calls without a result" + (" of unknown outcome" if args.unknown else ""))
    else:
        print(render_table(_COLUMNS, [[record[name] or "-" for name in _COLUMN_FIELDS] for record in records]))
    return EXIT_OK


_COLUMNS = tuple(Column(header) for header in ("TOOL", "KEY", "PRINCIPAL", "TENANT", "STATE", "REQUEST", "CREATED",
                                                "DEADLINE"))
_COLUMN_FIELDS = ("tool", "key", "principal_id", "tenant", "state", "request_id", "created_at", "deadline_at")


def cmd_resolve(args: argparse.Namespace) -> int:
    """``toolbooth operations resolve KEY --tool T --principal ID --completed|--failed``."""
    scope = KeyScope(args.tenant, args.principal, args.tool, args.key)
    result = resolved_result(scope, args.outcome, args.note)

    async def resolve(store: Store) -> None:
        record = await store.operation(scope)
        if record is None:
            raise CommandError(f"no keyed call {_name(scope)}", EXIT_FAILURE)
        if record.result_json is not None:  # completed or failed
            raise CommandError(f"the keyed call {_name(scope)} already has a result; nothing to resolve",
                               EXIT_FAILURE)
        if not await store.resolve_operation(scope, result.model_dump_json(), now=time.time()):
            raise CommandError(f"the keyed call {_name(scope)} finished meanwhile; nothing resolved", EXIT_FAILURE)

    with_store(args.config, resolve)
    outcome = "completed" if args.outcome is Status.SUCCESS else "failed"
    if json_output(args):
        print(dump_json({"resolved": True, "tenant": scope.tenant, "principal_id": scope.principal_id,
                         "tool": scope.tool, "key": scope.key, "outcome": outcome,
                         "result": result.model_dump(mode="json")}))
    else:
        print(f"resolved {_name(scope)} as {outcome}")
    return EXIT_OK


def resolved_result(scope: KeyScope, outcome: Status, note: str) -> ToolResult:
    """The result an operator's resolution stores: retries of the key replay it."""
    meta = ResultMeta(request_id=f"resolved-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}", tool=scope.tool)
    data = {"resolved_by_operator": True, "note": note}
    if outcome is Status.SUCCESS:
        return ToolResult(status=Status.SUCCESS, data=data, meta=meta)
    error = ErrorInfo.of(ErrorCode.INTERNAL_ERROR, f"{RESOLVED_FAILED_MESSAGE}{': ' + note if note else ''}")
    return ToolResult(status=Status.ERROR, data=data, error=error, errors=(error,), meta=meta)


def record_document(record: OperationRecord) -> dict[str, str | None]:
    """One record as JSON data: its scope, state, request id and times (RFC 3339, UTC)."""
    scope = record.scope
    return {"tenant": scope.tenant, "principal_id": scope.principal_id, "tool": scope.tool, "key": scope.key,
            "state": record.state.value, "request_id": record.request_id, "created_at": _utc(record.created_at),
            "deadline_at": None if record.deadline_at is None else _utc(record.deadline_at),
            "overran_at": None if record.overran_at is None else _utc(record.overran_at)}


def _utc(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


def _name(scope: KeyScope) -> str:
    return f"{scope.key!r} of tool {scope.tool!r}, principal {scope.principal_id!r}, tenant {scope.tenant!r}"
