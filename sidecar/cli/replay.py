"""``toolbooth policy replay``: what a candidate policy set would decide otherwise, on the audit log's calls.

A thin shell over ``sidecar.pipeline.replay``: it loads the candidate (a policy directory, or a bundle
file, read without checking its signature: ``policy bundle verify`` does that) into the engine
``policy.engine`` of ``--config`` names (``sidecar.policy.engines``; an OPA server is sent the candidate,
as ``serve`` sends its policies, so point it at one that serves no sidecar), reads the audit log of
the store of ``--config`` as ``toolbooth audit`` does, and prints the calls that would change as a
table, or everything as JSON (``--output json``; ``--json``, its older spelling, too).

Exit codes: 0 no replayed decision changes; 3 at least one would change; 1 the store cannot be read;
2 usage error, or a candidate that does not load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sidecar.cli.audit import all_records, newest_id, utc_event_time
from sidecar.cli.common import (
    EXIT_OK,
    EXIT_TOOL_ERROR,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    config_flag,
    dump_json,
    with_store,
)
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.progress import meter, progress_flag, progress_wanted
from sidecar.cli.table import Column, render_table
from sidecar.config import PolicySettings, load_settings
from sidecar.errors import PolicyLoadError
from sidecar.pipeline.replay import ReplayReport, replay_log
from sidecar.policy import PolicyEngine
from sidecar.policy.engines import UPLOAD_FLAG, may_send, open_candidate
from sidecar.state import Store

__all__ = ["EXIT_CHANGED", "add_replay_command", "cmd_replay", "format_report", "load_candidate", "upload_flag"]

EXIT_CHANGED = EXIT_TOOL_ERROR


def add_replay_command(policy_actions: Subparsers) -> None:
    """Add ``replay`` under ``toolbooth policy``."""
    replay = policy_actions.add_parser(
        "replay", help="re-decide the audit log's calls with a candidate policy set; exit 3 if any would change")
    replay.add_argument("--policies", required=True, type=Path, metavar="CANDIDATE",
                        help="the candidate: a policy directory or a bundle file (.tar.gz)")
    replay.add_argument("--since", type=utc_event_time, metavar="TIME",
                        help="only calls audited at or after this ISO 8601 time (UTC if no offset is given)")
    replay.add_argument("--tool", metavar="NAME", help="only calls of this tool")
    output_flag(replay, json_alias=True)
    progress_flag(replay)
    upload_flag(replay)
    config_flag(replay)
    replay.set_defaults(handler=cmd_replay)


def upload_flag(parser: argparse.ArgumentParser) -> None:
    """``--upload``: the configured OPA server may be sent the policies tried (no sidecar decides there)."""
    parser.add_argument(UPLOAD_FLAG, action="store_true",
                        help="with engine opa: send the policies to policy.opa's server, replacing what it serves")


def cmd_replay(args: argparse.Namespace) -> int:
    """``toolbooth policy replay``: 0 when nothing would change, 3 when something would."""
    policy, wanted = load_settings(args.config).policy, progress_wanted(args)

    async def run(store: Store) -> ReplayReport:
        engine = await load_candidate(policy, args.policies, upload=args.upload)
        try:
            with meter("replaying the audit log", enabled=wanted) as shown:
                if shown.drawn:
                    shown.update(0, await newest_id(store))
                return await replay_log(engine, all_records(store, progress=shown.update), since=args.since,
                                        tool=args.tool)
        finally:
            await engine.aclose()

    report = with_store(args.config, run)
    print(dump_json(report.document()) if json_output(args) else format_report(report))
    return EXIT_CHANGED if report.changes else EXIT_OK


async def load_candidate(settings: PolicySettings, path: Path, *, upload: bool = False) -> PolicyEngine:
    """The configured engine over the candidate at ``path``, a directory or a bundle file (a server that serves what
    it is sent only with ``upload``); a usage error saying why it does not load."""
    try:
        may_send(settings, upload=upload)
        return await open_candidate(settings, path)
    except PolicyLoadError as exc:
        raise CommandError(f"--policies {path}: {exc}", EXIT_USAGE) from None


_COLUMNS = (Column("ID", wrap=False), Column("TIME"), Column("TOOL"), Column("PRINCIPAL"), Column("BEFORE"),
            Column("AFTER"), Column("STAGE"), Column("CHANGE"), Column("REASON"))


def format_report(report: ReplayReport) -> str:
    """The changes as a table (one row per step that changes), then a summary line."""
    rows = []
    for change in report.changes:
        event, first = change.recorded.record.event, True
        for stage in change.stages:
            head = (str(change.recorded.record.id), event.time, event.tool, event.principal_id, change.before,
                    change.after) if first else ("",) * 6
            rows.append((*head, stage.stage, f"{stage.before} -> {stage.after}", stage.reason))
            first = False
    lines = [render_table(_COLUMNS, rows), ""] if rows else []
    skipped = sum(report.skipped.values())
    kinds = ", ".join(f"{count} {reason.value}" for reason, count in sorted(report.skipped.items()))
    lines.append(f"replayed {report.replayed} call(s) against revision {report.revision}: "
                 f"{len(report.changes)} would change" + (f"; skipped {skipped} ({kinds})" if skipped else ""))
    return "\n".join(lines)
