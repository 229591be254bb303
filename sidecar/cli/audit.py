"""``toolbooth audit verify | tail | export``: the configured store's audit log, read directly.

These commands open the store of ``--config`` (``sidecar.cli.common.with_store``), not a
running sidecar, so they work while it is stopped too. Records print as JSON lines: ``id``,
the event's fields, ``prev_hash`` and ``hash``; ``export --format opa`` prints each decision as
an OPA decision-log entry instead (``sidecar.pipeline.decision_log``).

``verify`` checks keyed links with ``audit.chain_key`` and the chain against the signed checkpoint
the sidecar writes (``audit.checkpoint_file``); without a chain key it checks the unkeyed chain
and says on stderr that such a chain can be recomputed and cut at its end unnoticed.

Exit codes: verify 0 the chain is intact (and matches the checkpoint), 1 it is broken, events were
removed after the checkpoint, the checkpoint's signature fails or the store cannot be read;
tail and export 0, or 1 when the store cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict

from sidecar.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandError, Subparsers, config_flag, with_store
from sidecar.config import load_settings
from sidecar.pipeline.decision_log import decision_log
from sidecar.state import AuditRecord, Store
from sidecar.state.chain import ChainReport, verify_store
from sidecar.state.checkpoint import Checkpoint, CheckpointError, compare, read_checkpoint

__all__ = ["FOLLOW_INTERVAL_SECONDS", "PAGE", "add_commands", "all_records", "cmd_export", "cmd_tail", "cmd_verify",
           "record_json", "utc_event_time"]

PAGE = 1000
FOLLOW_INTERVAL_SECONDS = 1.0


def add_commands(commands: Subparsers) -> None:
    """Add ``audit`` and its subcommands to the ``toolbooth`` parser."""
    audit = commands.add_parser("audit", help="verify, tail and export the audit log of the configured store")
    actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = actions.add_parser("verify", help="check the hash chain; exit 1 at the first broken link")
    verify.set_defaults(handler=cmd_verify)
    tail = actions.add_parser("tail", help="print the newest events as JSON lines")
    tail.add_argument("-n", type=int, default=20, metavar="N", help="how many (default: 20)")
    tail.add_argument("--follow", action="store_true", help="then keep printing new events until interrupted")
    tail.set_defaults(handler=cmd_tail)
    export = actions.add_parser("export", help="print every event as JSON lines")
    export.add_argument("--since", type=utc_event_time, metavar="TIME",
                        help="only events at or after this ISO 8601 time (UTC if no offset is given)")
    export.add_argument("--format", choices=("records", "opa"), default="records",
                        help="records: the events as stored (default); opa: one OPA decision-log entry per decision")
    export.set_defaults(handler=cmd_export)
    for parser in (verify, tail, export):
        config_flag(parser)


def cmd_verify(args: argparse.Namespace) -> int:
    """``toolbooth audit verify``: walk the chain, report its first broken link, compare it with the checkpoint."""
    settings = load_settings(args.config)
    key, path = settings.audit.read_chain_key(), settings.audit.checkpoint_path(settings.store)
    checkpoint: Checkpoint | None = None
    if key is None:
        print("audit chain unkeyed: no audit.chain_key is configured, so whoever can write the database can "
              "recompute the chain, and removing the newest events is not detected", file=sys.stderr)
    elif path.exists():
        try:
            checkpoint = read_checkpoint(path, key)
        except CheckpointError as exc:
            print(f"audit checkpoint INVALID: {exc}")
            return EXIT_FAILURE
    marks = checkpoint.marks if checkpoint else None
    report = with_store(args.config, lambda store: verify_store(store, page=PAGE, key=key, marks=marks))
    print(_describe(report))
    if report.broken is not None:
        return EXIT_FAILURE
    if checkpoint is None:
        if key is not None:
            print(f"no audit checkpoint at {path} yet: removing the newest events would not be detected")
        return EXIT_OK
    if (problem := compare(report, checkpoint)) is not None:
        print(problem)
        return EXIT_FAILURE
    print(f"checkpoint matches: {checkpoint.count} event(s) up to id {checkpoint.head_id}, "
          f"written {checkpoint.written_at}")
    return EXIT_OK


def cmd_tail(args: argparse.Namespace) -> int:
    """``toolbooth audit tail``: the newest ``-n`` events, then new ones with ``--follow``."""
    if args.n < 0:
        raise CommandError("-n must be 0 or more", EXIT_USAGE)

    async def tail(store: Store) -> None:
        newest = await store.audit_records(limit=args.n, newest_first=True) if args.n else []
        after = _print_records(reversed(newest), after=0)
        if not newest and args.follow:
            after = max((r.id for r in await store.audit_records(limit=1, newest_first=True)), default=0)
        while args.follow:
            await asyncio.sleep(FOLLOW_INTERVAL_SECONDS)
            after = _print_records(await store.audit_records(after_id=after, limit=PAGE), after=after)

    with contextlib.suppress(KeyboardInterrupt):  # how --follow ends
        with_store(args.config, tail)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """``toolbooth audit export``: every event (at or after ``--since``) as JSON lines, oldest first; with
    ``--format opa`` every decision of those events as an OPA decision-log entry."""

    async def export(store: Store) -> None:
        records = _since(all_records(store), args.since)
        if args.format == "opa":
            async for entry in decision_log(records):
                print(json.dumps(entry, ensure_ascii=False))
        else:
            async for record in records:
                print(record_json(record))

    with_store(args.config, export)
    return EXIT_OK


def record_json(record: AuditRecord) -> str:
    """One record as a JSON line."""
    line = {"id": record.id, **asdict(record.event), "prev_hash": record.prev_hash, "hash": record.hash}
    return json.dumps(line, ensure_ascii=False)


async def all_records(store: Store) -> AsyncIterator[AuditRecord]:
    """Every stored event, oldest first, read ``PAGE`` at a time."""
    after = 0
    while records := await store.audit_records(after_id=after, limit=PAGE):
        for record in records:
            yield record
        after = records[-1].id


async def _since(records: AsyncIterator[AuditRecord], since: str | None) -> AsyncIterator[AuditRecord]:
    async for record in records:
        if since is None or record.event.time >= since:
            yield record


def _print_records(records: Iterable[AuditRecord], *, after: int) -> int:
    """Print ``records``; return the id of the last one printed (``after`` if none)."""
    for record in records:
        print(record_json(record), flush=True)
        after = record.id
    return after


def _describe(report: ChainReport) -> str:
    old = f"; {report.unchained} older event(s) from before the chain are not covered" if report.unchained else ""
    if report.keyed and report.unkeyed:
        old += f"; {report.unkeyed} event(s) from before the chain key are hashed without it"
    if report.broken is None:
        last = f", last hash {report.last_hash}" if report.last_hash else ""
        return f"audit chain intact: {report.checked} event(s){last}{old}"
    return (f"audit chain BROKEN at event id {report.broken.id}: {report.broken.problem}\n"
            f"the {report.checked} event(s) before it are intact{old}")


def utc_event_time(text: str) -> str:
    """``text`` (ISO 8601) in the form events store their time, for comparing as text."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds")
