"""``toolbooth previews list``, ``toolbooth approve`` and ``toolbooth deny``: the approver's side, over gRPC.

Each runs with the caller's token (``--token`` / ``$TOOLBOOTH_TOKEN``): the sidecar's approval
policy decides whether that principal may approve. ``previews list`` reads the pending previews a page at a
time (``ListPreviews``' page tokens), up to ``--limit``; cut short, it prints the token to read on from. Its
table never folds an id or a time: when full ids would not fit the terminal, it shows each id's first
``SHOWN`` characters (more where two begin alike).

``approve`` and ``deny`` take an id or, as git does, a unique prefix of one (``MIN_PREFIX`` characters at
least), resolved in the pending previews the caller may approve, as ``previews list`` reads them: a prefix
never names a preview the caller may not see. A preview ``approve`` cannot find there (without ``--hash``)
is asked of the sidecar with a hash no preview has, so that nothing is approved and the sidecar says why
(the caller's own call, expired, already decided, not theirs to approve); an id the sidecar does not know
gets the same answer as a mistyped one.
Exit codes: 0 done, 1 gRPC error, 3 refused (the printed result says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sidecar.cli.common import (
    EXIT_OK,
    EXIT_TOOL_ERROR,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    client_flags,
    dump_json,
    field_flag,
    print_result,
    with_client,
)
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.table import Column, fits, render_table
from sidecar.contract import ApprovalResult, ErrorCode, Preview, PreviewState
from sidecar.display import visible
from sidecar.server.roles import MAX_LIST_LIMIT

if TYPE_CHECKING:
    from sidecar.client import Client

__all__ = ["MIN_PREFIX", "SHOWN", "add_commands", "cmd_approve", "cmd_deny", "cmd_previews_list", "describe",
           "previews_table"]

MIN_PREFIX = 8  # characters of an id that name a preview: of 48 random ones, a typo names another 1 in 4 billion
SHOWN = 12  # characters of each id a table too narrow for whole ids shows, at least
_ID_LENGTH = 48  # characters of a preview id (``secrets.token_hex(24)``): one this long is never a prefix
_LISTED = 1000  # pending previews ``previews list`` shows unless told otherwise
_SEARCHED = 100_000  # pending previews ``approve`` and ``deny`` read, at most, looking for the one named
_CANDIDATES = 10  # previews an ambiguous prefix lists, at most
_UNSEEN = "sha256:" + "0" * 64  # a preview hash no preview has: approving with it approves nothing


_ID_HELP = f"the preview's id, or its first {MIN_PREFIX} characters or more (a prefix no other pending one has)"


def add_commands(commands: Subparsers) -> None:
    """Add ``previews``, ``approve`` and ``deny`` to the ``toolbooth`` parser."""
    previews = commands.add_parser("previews", help="calls waiting for approval")
    actions = previews.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="pending previews you may approve (operators: all); in a narrow "
                                              f"table, ids shortened to {SHOWN} characters or more")
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
    approve.add_argument("preview_id", metavar="PREVIEW_ID", help=_ID_HELP)
    approve.add_argument("--hash", dest="preview_hash", metavar="H",
                         help="the preview_hash you were shown (default: the one `previews list` shows now)")
    approve.add_argument("--comment", metavar="C")
    field_flag(approve, "preview.state")
    output_flag(approve, None)
    client_flags(approve)
    approve.set_defaults(handler=cmd_approve)
    deny = commands.add_parser("deny", help="deny a preview: the call can never run under it")
    deny.add_argument("preview_id", metavar="PREVIEW_ID", help=_ID_HELP)
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


_TABLE = (Column("PREVIEW", whole=True), Column("TOOL"), Column("EXPIRES", whole=True), Column("ROLES"),
          Column("REASON"))


def previews_table(previews: list[Preview], width: int | None = None) -> str:
    """One row per preview: id, tool, expiry, approver roles, the policy's reason; fitted to ``width`` (default:
    the terminal's) with each id whole, or its first ``SHOWN`` characters or more when whole ids would not fit."""
    rows = [[p.preview_id, _tool(p), p.expires_at, ", ".join(p.approver_roles), p.reason] for p in previews]
    if not fits(_TABLE, rows, width):
        shown = _unique_length([p.preview_id for p in previews])
        rows = [[row[0][:shown], *row[1:]] for row in rows]
    return render_table(_TABLE, rows, width)


def _unique_length(ids: list[str]) -> int:
    """The fewest characters, ``SHOWN`` at least, in which no two of ``ids`` begin alike."""
    return max(SHOWN, *(_alike(a, b) + 1 for a, b in itertools.pairwise(sorted(ids))))


def _alike(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` begin with alike."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _tool(preview: Preview) -> str:
    try:
        call = json.loads(preview.call_json)
    except json.JSONDecodeError:
        return "?"
    return str(call.get("tool", "?")) if isinstance(call, dict) else "?"


def cmd_approve(args: argparse.Namespace) -> int:
    """``toolbooth approve PREVIEW_ID``: without ``--hash``, approve the call ``previews list`` shows."""
    if args.preview_hash:
        preview_id, preview_hash = _resolved(args), args.preview_hash
    else:
        listed = _listed(args)
        preview_id, preview_hash = listed.preview_id, listed.preview_hash
    result = with_client(args, lambda client: client.approve(preview_id, preview_hash, comment=args.comment))
    return _report(result, args)


def cmd_deny(args: argparse.Namespace) -> int:
    """``toolbooth deny PREVIEW_ID --reason R``."""
    preview_id = _resolved(args)
    return _report(with_client(args, lambda client: client.deny(preview_id, reason=args.reason)), args)


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


def _named(client: Client, preview_id: str) -> list[Preview]:
    """The pending previews the caller may approve that ``preview_id`` names: the one of that id (read no further),
    or those whose id begins with it (``MIN_PREFIX`` characters or more)."""
    named = []
    for page, _ in _pages(client, _SEARCHED):
        for preview in page:
            if preview.preview_id == preview_id:
                return [preview]
            if len(preview_id) >= MIN_PREFIX and preview.preview_id.startswith(preview_id):
                named.append(preview)
    return named


def _found(args: argparse.Namespace) -> Preview | None:
    """The one pending preview the caller may approve that ``args.preview_id`` names, or ``None``; a usage
    error for a prefix that names several, or one too short to name any."""
    named = with_client(args, lambda client: _named(client, args.preview_id))
    if len(named) > 1:
        listed = "\n".join(f"  {p.preview_id}  {_tool(p)}" for p in named[:_CANDIDATES])
        more = f"\n  and {len(named) - _CANDIDATES} more" if len(named) > _CANDIDATES else ""
        raise CommandError(f"{args.preview_id!r} begins the ids of {len(named)} pending previews; give more of "
                           f"the one you mean:\n{visible(listed)}{more}", EXIT_USAGE, "AMBIGUOUS_PREVIEW_ID")
    if not named and len(args.preview_id) < MIN_PREFIX:
        raise CommandError(f"{args.preview_id!r} is too short to name a preview: give its id, or its first "
                           f"{MIN_PREFIX} characters or more", EXIT_USAGE, "PREVIEW_ID_TOO_SHORT")
    return named[0] if named else None


def _resolved(args: argparse.Namespace) -> str:
    """The id ``args.preview_id`` names: itself when it is as long as an id, else the one pending preview the
    caller may approve it names (or itself when it names none, for the sidecar to answer)."""
    if len(args.preview_id) >= _ID_LENGTH:
        return str(args.preview_id)
    found = _found(args)
    return str(args.preview_id) if found is None else found.preview_id


def _listed(args: argparse.Namespace) -> Preview:
    """The pending preview ``args.preview_id`` names, shown on stderr; else ``CommandError`` with the sidecar's
    reason why it is not there to approve."""
    found = _found(args)
    if found is None:
        raise _not_listed(args.preview_id, with_client(args, lambda client: client.approve(args.preview_id, _UNSEEN)))
    print(f"approving:\n{describe(found)}", file=sys.stderr)
    return found


def _not_listed(preview_id: str, asked: ApprovalResult) -> CommandError:
    """Why ``preview_id`` is not among the previews the caller may approve: the refusal of an approval with a hash
    no preview has (``asked``), as far as the sidecar tells the caller."""
    error, preview = asked.error, asked.preview
    if error is None or error.code is ErrorCode.RESOURCE_NOT_FOUND:
        return CommandError(f"preview {preview_id!r} is not among the pending previews you may approve; "
                            "check the id, or pass --hash", EXIT_TOOL_ERROR)
    if error.field == "preview_hash" and preview is not None and preview.state is not PreviewState.PENDING:
        return CommandError(f"preview {preview_id!r} is already {preview.state}", EXIT_TOOL_ERROR, "ALREADY_DECIDED")
    if error.field == "preview_hash":  # pending, and the caller's to approve: it came after the listing was read
        return CommandError(f"preview {preview_id!r} was not among the pending previews just read; approve it again, "
                            "or pass --hash", EXIT_TOOL_ERROR, "NOT_LISTED")
    return CommandError(f"preview {preview_id!r} cannot be approved: {visible(error.message)}", EXIT_TOOL_ERROR,
                        error.code.value)


def _report(result: ApprovalResult, args: argparse.Namespace) -> int:
    print_result(result.model_dump(mode="json", exclude_none=True), args.field, as_json=json_output(args))
    return EXIT_OK if result.ok else EXIT_TOOL_ERROR
