"""``toolbooth previews list``, ``toolbooth approve`` and ``toolbooth deny``: the approver's side, over gRPC.

Each runs with the caller's token (``--token`` / ``$TOOLBOOTH_TOKEN``): the sidecar's approval
policy decides whether that principal may approve. ``previews list`` reads the pending previews a page at a
time (``ListPreviews``' page tokens), up to ``--limit``; cut short, it prints the token to read on from.
Exit codes: 0 done, 1 gRPC error, 3 refused (the printed result says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sidecar.cli.common import (
    EXIT_OK,
    EXIT_TOOL_ERROR,
    CommandError,
    Subparsers,
    client_flags,
    dump_json,
    field_flag,
    print_result,
    with_client,
)
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.table import Column, render_table
from sidecar.contract import ApprovalResult, Preview
from sidecar.display import visible
from sidecar.server.roles import MAX_LIST_LIMIT

if TYPE_CHECKING:
    from sidecar.client import Client

__all__ = ["add_commands", "cmd_approve", "cmd_deny", "cmd_previews_list", "describe", "previews_table"]

_LISTED = 1000  # pending previews ``previews list`` shows unless told otherwise
_SEARCHED = 100_000  # pending previews ``approve`` without ``--hash`` reads, at most, looking for the one to approve


def add_commands(commands: Subparsers) -> None:
    """Add ``previews``, ``approve`` and ``deny`` to the ``toolbooth`` parser."""
    previews = commands.add_parser("previews", help="calls waiting for approval")
    actions = previews.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="pending previews you may approve (operators: all)")
    listing.add_argument("--limit", type=_positive, default=_LISTED, metavar="N",
                         help=f"at most N, newest first, read a page at a time (default: {_LISTED})")
    listing.add_argument("--page-token", default="", metavar="T",
                         help="start after this page token (the one a listing cut short printed)")
    listing.add_argument("-l", "--long", action="store_true",
                         help="each preview in full (hash, call, what it will do) instead of a table")
    output_flag(listing, "table")
    client_flags(listing)
    listing.set_defaults(handler=cmd_previews_list)
    approve = commands.add_parser("approve", help="approve a preview: that exact call may then run once")
    approve.add_argument("preview_id", metavar="PREVIEW_ID")
    approve.add_argument("--hash", dest="preview_hash", metavar="H",
                         help="the preview_hash you were shown (default: the one `previews list` shows now)")
    approve.add_argument("--comment", metavar="C")
    field_flag(approve, "preview.state")
    output_flag(approve, None)
    client_flags(approve)
    approve.set_defaults(handler=cmd_approve)
    deny = commands.add_parser("deny", help="deny a preview: the call can never run under it")
    deny.add_argument("preview_id", metavar="PREVIEW_ID")
    deny.add_argument("--reason", required=True, metavar="R")
    field_flag(deny, "preview.state")
    output_flag(deny, None)
    client_flags(deny)
    deny.set_defaults(handler=cmd_deny)


def cmd_previews_list(args: argparse.Namespace) -> int:
    """``toolbooth previews list``: a table, each preview in full (``--long``), or JSON."""
    previews, more = with_client(args, lambda client: _read(client, args.limit, args.page_token))
    if more:
        print(f"more previews are pending: list them with --page-token {more}", file=sys.stderr)
    if json_output(args):
        print(dump_json([p.model_dump(mode="json") for p in previews]))
    elif not previews:
        print("no pending previews")
    else:
        print("\n\n".join(describe(p) for p in previews) if args.long else previews_table(previews))
    return EXIT_OK


def previews_table(previews: list[Preview]) -> str:
    """One row per preview: id, tool, expiry, approver roles, the policy's reason."""
    columns = tuple(Column(header) for header in ("PREVIEW", "TOOL", "EXPIRES", "ROLES", "REASON"))
    return render_table(columns, [(p.preview_id, _tool(p), p.expires_at, ", ".join(p.approver_roles), p.reason)
                                  for p in previews])


def _tool(preview: Preview) -> str:
    try:
        call = json.loads(preview.call_json)
    except json.JSONDecodeError:
        return "?"
    return str(call.get("tool", "?")) if isinstance(call, dict) else "?"


def cmd_approve(args: argparse.Namespace) -> int:
    """``toolbooth approve PREVIEW_ID``: without ``--hash``, approve the call ``previews list`` shows."""
    preview_hash = args.preview_hash or _listed(args).preview_hash
    result = with_client(args, lambda client: client.approve(args.preview_id, preview_hash, comment=args.comment))
    return _report(result, args)


def cmd_deny(args: argparse.Namespace) -> int:
    """``toolbooth deny PREVIEW_ID --reason R``."""
    return _report(with_client(args, lambda client: client.deny(args.preview_id, reason=args.reason)), args)


def describe(preview: Preview) -> str:
    """A preview for a person: id, hash, why, until when, who may approve, the call and, for a tool that
    renders its calls, what it will do (its rendering, indented); hidden characters marked (``sidecar.display``)."""
    lines = [
        f"preview  {preview.preview_id}",
        f"hash     {preview.preview_hash}",
        f"reason   {preview.reason}",
        f"expires  {preview.expires_at}",
        f"approve  with one of the roles {', '.join(preview.approver_roles)}",
        f"call     {preview.call_json}",
    ]
    if preview.rendering_json is not None:
        rendering = json.dumps(json.loads(preview.rendering_json), indent=2, ensure_ascii=False)
        lines.append("will do  " + rendering.replace("\n", "\n         "))
    return visible("\n".join(lines))


def _pages(client: Client, limit: int, page_token: str = "") -> Iterator[tuple[list[Preview], str]]:
    """The pending previews, newest first, after ``page_token``, a page at a time, up to ``limit`` in all: each
    page with the token after it (``""`` after the last)."""
    read = 0
    while read < limit:
        page, page_token = client.previews_page(limit=min(limit - read, MAX_LIST_LIMIT), page_token=page_token)
        yield page, page_token
        if not page_token:
            return
        read += len(page)


def _read(client: Client, limit: int, page_token: str = "") -> tuple[list[Preview], str]:
    """Up to ``limit`` (at least 1) pending previews, newest first, after ``page_token``; and the token after the
    last one read when more are pending."""
    pages = list(_pages(client, limit, page_token))
    return [preview for page, _ in pages for preview in page], pages[-1][1]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return int(text)


def _listed(args: argparse.Namespace) -> Preview:
    found = with_client(args, lambda client: next((p for page, _ in _pages(client, _SEARCHED) for p in page
                                                   if p.preview_id == args.preview_id), None))
    if found is None:
        raise CommandError(f"preview {args.preview_id!r} is not among the pending previews you may approve; "
                           "check the id, or pass --hash", EXIT_TOOL_ERROR)
    print(f"approving:\n{describe(found)}", file=sys.stderr)
    return found


def _report(result: ApprovalResult, args: argparse.Namespace) -> int:
    print_result(result.model_dump(mode="json", exclude_none=True), args.field, as_json=json_output(args))
    return EXIT_OK if result.ok else EXIT_TOOL_ERROR
