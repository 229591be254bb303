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
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sidecar.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    config_flag,
    dump_json,
    with_store,
)
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.progress import meter, progress_flag, progress_wanted
from sidecar.config import load_settings
from sidecar.pipeline.decision_log import decision_log
from sidecar.state import AuditRecord, Store
from sidecar.state.chain import ChainReport, verify_store
from sidecar.state.checkpoint import Checkpoint, CheckpointError, compare, read_checkpoint

__all__ = ["FOLLOW_INTERVAL_SECONDS", "PAGE", "UNKEYED", "add_commands", "all_records", "cmd_export", "cmd_tail",
           "cmd_verify", "newest_id", "record_json", "utc_event_time"]

PAGE = 1000
FOLLOW_INTERVAL_SECONDS = 1.0


def add_commands(commands: Subparsers) -> None:
    """Add ``audit`` and its subcommands to the ``toolbooth`` parser."""
    audit = commands.add_parser("audit", help="verify, tail and export the audit log of the configured store")
    actions = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = actions.add_parser("verify", help="check the hash chain; exit 1 at the first broken link")
    output_flag(verify)
    progress_flag(verify)
    verify.set_defaults(handler=cmd_verify)
    tail = actions.add_parser("tail", help="print the newest events as JSON lines")
    tail.add_argument("-n", type=int, default=20, metavar="N", help="how many (default: 20)")
    tail.add_argument("--follow", action="store_true", help="then keep printing new events until interrupted")
    output_flag(tail, None)
    tail.set_defaults(handler=cmd_tail)
    export = actions.add_parser("export", help="print every event as JSON lines")
    export.add_argument("--since", type=utc_event_time, metavar="TIME",
                        help="only events at or after this ISO 8601 time (UTC if no offset is given)")
    export.add_argument("--format", choices=("records", "opa"), default="records",
                        help="records: the events as stored (default); opa: one OPA decision-log entry per decision")
    output_flag(export, None)
    progress_flag(export)
    export.set_defaults(handler=cmd_export)
    for parser in (verify, tail, export):
        config_flag(parser)


UNKEYED = ("audit chain unkeyed: no audit.chain_key is configured, so whoever can write the database can "
           "recompute the chain, and removing the newest events is not detected")


def cmd_verify(args: argparse.Namespace) -> int:
    """``toolbooth audit verify``: walk the chain, report its first broken link, compare it with the checkpoint;
    print what was found as text, or as the JSON document of ``_Verification.document``."""
    settings = load_settings(args.config)
    key, path = settings.audit.read_chain_key(), settings.audit.checkpoint_path(settings.store)
    as_json = json_output(args)
    if key is None and not as_json:
        print(UNKEYED, file=sys.stderr)
    found = _Verification(path, keyed=key is not None)
    ok = found.run(args, key)
    print(dump_json(found.document(ok)) if as_json else "\n".join(found.lines))
    return EXIT_OK if ok else EXIT_FAILURE


class _Verification:
    """What ``audit verify`` found, as the lines it prints and as its JSON document."""

    def __init__(self, path: Path, *, keyed: bool) -> None:
        self.path, self.keyed = path, keyed
        self.lines: list[str] = []
        self.report: ChainReport | None = None
        self.checkpoint: Checkpoint | None = None
        # absent, invalid, unkeyed (no key, no checkpoint), not_compared (the chain is broken), contradicted, matches
        self.state = "absent" if keyed else "unkeyed"
        self.problem: str | None = None

    def run(self, args: argparse.Namespace, key: bytes | None) -> bool:
        """Verify; whether the chain is intact and matches the checkpoint (if there is one)."""
        if key is not None and self.path.exists():
            try:
                self.checkpoint = read_checkpoint(self.path, key)
            except CheckpointError as exc:
                return self._failed("invalid", f"audit checkpoint INVALID: {exc}", str(exc))
        marks = self.checkpoint.marks if self.checkpoint else None
        wanted = progress_wanted(args)

        async def walk(store: Store) -> ChainReport:
            with meter("verifying the audit chain", enabled=wanted) as shown:
                if shown.drawn:
                    shown.update(0, await newest_id(store))
                return await verify_store(store, page=PAGE, key=key, marks=marks,
                                          progress=shown.update)

        report = self.report = with_store(args.config, walk)
        self.lines.append(_describe(report))
        if report.broken is not None:
            if self.checkpoint is not None:
                self.state = "not_compared"
            return False
        if self.checkpoint is None:
            if key is not None:
                self.lines.append(f"no audit checkpoint at {self.path} yet: removing the newest events would not be "
                                  "detected")
            return True
        if (problem := compare(report, self.checkpoint)) is not None:
            return self._failed("contradicted", problem, problem)
        self.state = "matches"
        self.lines.append(f"checkpoint matches: {self.checkpoint.count} event(s) up to id {self.checkpoint.head_id}, "
                          f"written {self.checkpoint.written_at}")
        return True

    def _failed(self, state: str, line: str, problem: str) -> bool:
        self.state, self.problem = state, problem
        self.lines.append(line)
        return False

    def document(self, ok: bool) -> dict[str, Any]:
        """``ok``, ``keyed``, ``chain`` (``None`` if it was not walked), ``checkpoint`` and ``warnings``."""
        report, checkpoint = self.report, self.checkpoint
        chain = None if report is None else {
            "checked": report.checked, "unchained": report.unchained, "unkeyed": report.unkeyed,
            "last_hash": report.last_hash,
            "broken": None if report.broken is None else {"id": report.broken.id, "problem": report.broken.problem}}
        return {"ok": ok, "keyed": self.keyed, "chain": chain,
                "checkpoint": {"file": str(self.path), "state": self.state, "problem": self.problem,
                               **({} if checkpoint is None else _checkpoint_fields(checkpoint))},
                "warnings": [] if self.keyed else [UNKEYED]}


def _checkpoint_fields(checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint in ``audit verify``'s JSON: its totals, when it was written and each chain's head."""
    return {"count": checkpoint.count, "head_id": checkpoint.head_id, "written_at": checkpoint.written_at,
            "chains": [asdict(head) for head in checkpoint.heads]}


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

    wanted = progress_wanted(args, prints_while_working=True)

    async def export(store: Store) -> None:
        with meter("exporting the audit log", enabled=wanted) as shown:
            if shown.drawn:
                shown.update(0, await newest_id(store))
            records = _since(all_records(store, progress=shown.update), args.since)
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


async def all_records(store: Store, progress: Callable[[int], None] | None = None) -> AsyncIterator[AuditRecord]:
    """Every stored event, oldest first, read ``PAGE`` at a time; ``progress`` is told the id of the last
    record of each page read (``newest_id`` is the total to measure it against)."""
    after = 0
    while records := await store.audit_records(after_id=after, limit=PAGE):
        for record in records:
            yield record
        after = records[-1].id
        if progress is not None:
            progress(after)


async def newest_id(store: Store) -> int:
    """The id of the newest stored event (0 for none): how far ``all_records`` goes."""
    return max((record.id for record in await store.audit_records(limit=1, newest_first=True)), default=0)


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
