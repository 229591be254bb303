"""``toolbooth policy test | check | eval | replay``: the security team's commands (``docs/policies.md``).

A thin shell like the rest of ``sidecar.cli``: ``sidecar.policy.devtools`` runs the Rego tests and checks,
``sidecar.pipeline.dry_run`` evaluates decisions; this module parses flags, prints text or JSON (``--output``)
and turns the outcome into an exit code. Every command reads the policy directory given to it, else
``policy.path`` of ``--config`` (by default the bundled policies); check, eval and replay decide with the
engine its ``policy.engine`` names (``sidecar.policy.engines``: an OPA server is sent the policies).

Exit codes:
  test   0 every test passed (and every file reached --threshold); 1 otherwise; 2 the policies do not load
  check  0 no problem; 1 a problem (including policies that do not load)
  eval   0 the call would run; 1 a policy failed; 2 usage error or policies that do not load;
         3 the call would be denied or its arguments are invalid; 4 it would need approval
  replay 0 no recorded decision would change; 3 some would; 1 the store cannot be read; 2 usage error or
         a candidate that does not load (``sidecar.cli.replay``)

A command group is one ``_add_*`` function that takes the ``policy`` subparsers;
``add_commands`` lists them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sidecar.cli.bundle import add_bundle_commands
from sidecar.cli.common import (
    EXIT_APPROVAL_REQUIRED,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_TOOL_ERROR,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    client_flags,
    config_flag,
    dump_json,
    read_arguments,
    with_client,
)
from sidecar.cli.flags import Deprecated, given_policies, policies_flag, renamed
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.policy_inputs import read_history, read_principal, utc_time
from sidecar.cli.progress import meter, progress_flag, progress_wanted
from sidecar.cli.replay import add_replay_command, upload_flag
from sidecar.cli.table import Column, render_table
from sidecar.config import Settings, load_settings
from sidecar.contract import Principal
from sidecar.errors import PluginLoadError, PolicyLoadError
from sidecar.pipeline.dry_run import VALIDATION, DryRun, Verdict, dry_run
from sidecar.policy.devtools.check import check_policies
from sidecar.policy.devtools.runner import Outcome, RegoTestReport, run_tests
from sidecar.policy.engines import may_send, open_engine
from sidecar.policy.input import now_utc
from sidecar.tools.definition import ToolDefinition
from sidecar.tools.registry import Registry

__all__ = [
    "add_commands",
    "cmd_check",
    "cmd_eval",
    "cmd_status",
    "cmd_test",
    "format_coverage",
    "format_dry_run",
    "format_status",
    "format_tests",
    "installed_tool",
    "policy_dir",
    "tests_document",
]

Result = TypeVar("Result")
_RULE = "-" * 80


def add_commands(commands: Subparsers) -> None:
    """Add ``policy`` and its subcommands to the ``toolbooth`` parser."""
    policy = commands.add_parser("policy", help="test, check, dry-run and replay policies")
    actions = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    for add in (_add_test, _add_check, _add_eval, add_replay_command, _add_status, add_bundle_commands):
        add(actions)


def _add_test(actions: Subparsers) -> None:
    test = actions.add_parser("test", help="run the test_* rules of the *_test.rego files, like opa test")
    policies_flag(test)
    test.add_argument("--coverage", action="store_true", help="print line coverage of each policy file")
    test.add_argument("--threshold", type=float, metavar="PERCENT",
                      help="fail unless every policy file reaches this line coverage (implies --coverage)")
    test.add_argument("-v", "--verbose", action="store_true", help="list passing tests too")
    progress_flag(test)
    _common_flags(test)
    test.set_defaults(handler=cmd_test)


def _add_check(actions: Subparsers) -> None:
    check = actions.add_parser("check", help="compile the policies and check the decisions of sample calls")
    policies_flag(check)
    _common_flags(check)
    upload_flag(check)
    check.set_defaults(handler=cmd_check)


def _add_eval(actions: Subparsers) -> None:
    evaluate = actions.add_parser("eval", help="dry-run the decisions of one call; nothing executes")
    evaluate.add_argument("--tool", required=True, metavar="NAME", help="an installed tool")
    evaluate.add_argument("--principal-file", type=Path, metavar="FILE",
                          help='the calling principal, a JSON file: {"id", "tenant", "roles", "permissions"} '
                               "(required)")
    evaluate.add_argument("--principal", dest="principal_flag", type=Path, action=Deprecated,
                          instead="--principal-file FILE", metavar="FILE", help="deprecated: use --principal-file")
    evaluate.add_argument("--args", dest="arguments", default="{}", metavar="JSON",
                          help="arguments as a JSON object, @FILE to read a file, - to read stdin (default: {})")
    policies_flag(evaluate, positional=False)
    evaluate.add_argument("--history", type=Path, metavar="FILE", help="JSON: the history the call's decisions read "
                          '({"history": {"meters", "failures"}, "conversation": {"labels"}}; default: none)')
    evaluate.add_argument("--conversation-id", metavar="ID",
                          help="the call's conversation (default: the --history file's conversation.id)")
    evaluate.add_argument("--time", type=utc_time, metavar="RFC3339",
                          help="input.context.time, e.g. 2026-11-30T15:00:00Z (default: now)")
    _common_flags(evaluate)
    upload_flag(evaluate)
    evaluate.set_defaults(handler=cmd_eval)


def _add_status(actions: Subparsers) -> None:
    status = actions.add_parser("status", help="the running sidecar's policy revision and last reload")
    client_flags(status)
    output_flag(status)
    status.set_defaults(handler=cmd_status)


def _common_flags(parser: argparse.ArgumentParser) -> None:
    config_flag(parser, "YAML config: its policy.path and engine")
    output_flag(parser)


# --- status -----------------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    """``toolbooth policy status``: exit 0 while the latest policy change is in force, 1 while it is refused."""
    status = with_client(args, lambda client: client.policy_status())
    document = {"source": status.source, "revision": status.revision, "loaded_at": status.loaded_at,
                "last_attempt_at": status.last_attempt_at, "last_error": status.last_error}
    print(dump_json(document) if json_output(args) else format_status(document))
    return EXIT_OK if status.healthy else EXIT_FAILURE


def format_status(document: dict[str, Any]) -> str:
    """The status document for a person: revision, source, load time and, while refused, why."""
    lines = [f"revision    {document['revision']}", f"source      {document['source']}",
             f"loaded at   {document['loaded_at']}"]
    if document["last_error"]:
        lines.append(f"REFUSED     the change seen at {document['last_attempt_at']} "
                     f"(the revision above still serves):\n{document['last_error']}")
    return "\n".join(lines)


# --- test -------------------------------------------------------------------------------------------------


def cmd_test(args: argparse.Namespace) -> int:
    """``toolbooth policy test``: run the Rego tests, optionally with a coverage threshold."""
    root = policy_dir(given_policies(args), args.config)
    with meter("running the policy tests", enabled=progress_wanted(args)) as shown:
        report = _loading(lambda path: run_tests(path, progress=shown.update), root)
    threshold, coverage = args.threshold, args.coverage or args.threshold is not None
    if json_output(args):
        print(dump_json(tests_document(report, coverage=coverage, threshold=threshold)))
    else:
        print(format_tests(report, verbose=args.verbose, coverage=coverage, threshold=threshold))
    return EXIT_OK if report.passed and not report.coverage.below(threshold) else EXIT_FAILURE


def tests_document(report: RegoTestReport, *, coverage: bool, threshold: float | None) -> dict[str, Any]:
    """The report as JSON data; coverage only when asked for."""
    document: dict[str, Any] = {
        "root": str(report.root),
        "ok": report.passed and not report.coverage.below(threshold),
        "summary": {"total": len(report.tests), **{o.value: report.count(o) for o in Outcome}},
        "tests": [{"rule": t.rule, "package": t.package, "name": t.name, "file": t.file, "line": t.line,
                   "outcome": t.outcome.value, "message": t.message, "duration_ms": round(t.duration * 1000, 3)}
                  for t in report.tests],
    }
    if coverage:
        document["coverage"] = {
            "percent": round(report.coverage.percent, 2), "threshold": threshold,
            "below_threshold": report.coverage.below(threshold),
            "files": [{"file": f.file, "percent": round(f.percent, 2), "covered": list(f.covered),
                       "not_covered": list(f.not_covered)} for f in report.coverage.files],
        }
    return document


def format_tests(report: RegoTestReport, *, verbose: bool, coverage: bool, threshold: float | None) -> str:
    """Failures (every test with ``verbose``), the summary, then the coverage table."""
    lines = []
    for test in report.tests:
        if verbose or test.outcome is not Outcome.PASS:
            lines.append(f"{test.outcome.name:<5} {test.rule} ({test.duration * 1000:.2f} ms)")
            lines += [f"      {line}" for line in test.message.splitlines()]
    if not report.tests:
        lines.append(f"no test_* rules found under {report.root}")
    lines.append(_RULE)
    total = len(report.tests)
    lines += [f"{o.name}: {report.count(o)}/{total}" for o in Outcome if o is Outcome.PASS or report.count(o)]
    if coverage:
        lines += ["", format_coverage(report)]
    if below := report.coverage.below(threshold):
        lines.append(f"coverage below {threshold:g}%: {', '.join(below)}")
    return "\n".join(lines)


def format_coverage(report: RegoTestReport) -> str:
    """Per-file line coverage and the total, as an aligned table."""
    rows = [(f.file, f"{len(f.covered)}/{f.lines}", f"{f.percent:.1f}%", ", ".join(map(str, f.not_covered)))
            for f in report.coverage.files]
    covered = sum(len(f.covered) for f in report.coverage.files)
    lines = sum(f.lines for f in report.coverage.files)
    rows.append(("total", f"{covered}/{lines}", f"{report.coverage.percent:.1f}%", ""))
    return render_table(_COVERAGE_COLUMNS, rows)


_COVERAGE_COLUMNS = (Column("FILE"), Column("LINES", right=True), Column("COVERED", right=True),
                     Column("NOT COVERED"))


# --- check ------------------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    """``toolbooth policy check``: compile, find the entrypoints, check decisions on sample calls."""
    policy = load_settings(args.config).policy
    try:
        may_send(policy, upload=args.upload)
    except PolicyLoadError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    report = asyncio.run(check_policies(policy, root := given_policies(args) or policy.path))
    print(dump_json(report.document(root)) if json_output(args) else report.text(root))
    return EXIT_OK if report.ok else EXIT_FAILURE


# --- eval -------------------------------------------------------------------------------------------------


_VERDICT_EXIT = {Verdict.WOULD_RUN: EXIT_OK, Verdict.UNAVAILABLE: EXIT_TOOL_ERROR,
                 Verdict.INVALID_ARGUMENTS: EXIT_TOOL_ERROR, Verdict.DENIED: EXIT_TOOL_ERROR,
                 Verdict.APPROVAL_REQUIRED: EXIT_APPROVAL_REQUIRED, Verdict.POLICY_ERROR: EXIT_FAILURE}
_OUTCOMES = {
    Verdict.WOULD_RUN: "the call would run",
    Verdict.UNAVAILABLE: "TOOL_UNAVAILABLE, the tool is not available to this principal",
    Verdict.INVALID_ARGUMENTS: "INVALID_ARGUMENT, the arguments do not fit the tool's input model",
    Verdict.DENIED: "denied by the authz policy",
    Verdict.APPROVAL_REQUIRED: "APPROVAL_REQUIRED, a person must approve the call first",
    Verdict.POLICY_ERROR: "a policy failed, so the sidecar would deny the call",
}
_DETAILS = (("internal_reason", "internal reason"), ("approver_roles", "approver roles"),
            ("preview_ttl_seconds", "preview lives (s)"), ("retry_after_seconds", "retry after (s)"),
            ("cacheable", "cacheable"))


def cmd_eval(args: argparse.Namespace) -> int:
    """``toolbooth policy eval``: the decisions one call would get, in the sidecar's order; nothing runs."""
    settings = load_settings(args.config)
    defn = installed_tool(settings, args.tool)
    principal = read_principal(_principal_file(args))
    arguments = read_arguments(args.arguments)
    history = None if args.history is None else read_history(args.history)
    conversation = args.conversation_id or (history or {}).get("conversation", {}).get("id")
    run = asyncio.run(_dry_run(settings, given_policies(args), defn, principal, arguments, time=args.time or now_utc(),
                               upload=args.upload, history=history, conversation_id=conversation))
    print(dump_json(run.document()) if json_output(args) else format_dry_run(run))
    return _VERDICT_EXIT[run.verdict]


async def _dry_run(settings: Settings, root: Path | None, defn: ToolDefinition[Any, Any], principal: Principal,
                   arguments: str, *, time: str, upload: bool, history: dict[str, Any] | None,
                   conversation_id: str | None) -> DryRun:
    """The dry run on the configured engine, over ``root`` (else what ``serve`` decides on)."""
    try:
        may_send(settings.policy, upload=upload)
        engine = await open_engine(settings.policy, root)
    except PolicyLoadError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    try:
        return await dry_run(engine, defn, principal, arguments, limits=settings.limits, time=time, history=history,
                             conversation_id=conversation_id)
    finally:
        await engine.aclose()


def _principal_file(args: argparse.Namespace) -> Path:
    """``--principal-file`` (``--principal``, its older spelling, too); a usage error without either."""
    path: Path | None = renamed(args, "principal_file", "principal_flag", "--principal-file")
    if path is None:
        raise CommandError("policy eval needs --principal-file FILE: the calling principal", EXIT_USAGE)
    return path


def format_dry_run(run: DryRun) -> str:
    """The dry run for a person: the call, each step reached, what was not, the outcome."""
    result = run.document()
    tool, who = result["tool"], result["principal"]
    lines = [f"tool:       {tool['name']} {tool['version']} ({tool['plugin']}), side effect {tool['side_effect']}, "
             f"requires {_listed(tool['permissions'])}",
             f"principal:  {who['id']}, tenant {who['tenant'] or '-'}, roles {_listed(who['roles'])}, "
             f"permissions {_listed(who['permissions'])}",
             f"revision:   {result['revision']}",
             f"time:       {result['time']}",
             ""]
    if "history" in result:
        lines += [f"history:    {json.dumps(result['history'], ensure_ascii=False)}", ""]
    for step, document in result["steps"].items():
        lines += _format_step(step, document)
    if result["not_reached"]:
        lines.append(f"not reached: {', '.join(result['not_reached'])}")
    lines.append(f"outcome: {_OUTCOMES[run.verdict]} (dry run: nothing was executed)")
    return "\n".join(lines)


def _format_step(step: str, document: dict[str, Any]) -> list[str]:
    """One step: its answer and reason on the first line, details indented below."""
    if "error" in document:
        head, details = "ERROR", document["error"].splitlines()
    elif step == VALIDATION:
        head = "valid" if document["valid"] else "INVALID"
        details = [f"{error['code']}: {error['message']}" for error in document["errors"]]
        details += [f"arguments: {json.dumps(document['arguments'])}"] if document["valid"] else []
    else:
        head = _answer(document)
        reason = " ".join(part for part in (document.get("code"), document.get("reason")) if part)
        head = f"{head:<13} {reason}".rstrip()
        details = [f"{label}: {_listed(document[key]) if isinstance(document[key], list) else document[key]}"
                   for key, label in _DETAILS if key in document]
    return [f"{step:<13} {head}", *(f"{'':<13} {line}" for line in details)]


def _answer(document: dict[str, Any]) -> str:
    if "required" in document:
        return "REQUIRED" if document["required"] else "not required"
    return "allow" if document["allow"] else "DENY"


def _listed(items: list[str]) -> str:
    return ", ".join(items) or "-"


# --- helpers ----------------------------------------------------------------------------------------------


def policy_dir(given: Path | None, config: Path | None) -> Path:
    """``given``, else ``policy.path`` of the settings (the bundled policies by default)."""
    return given if given is not None else load_settings(config).policy.path


def installed_tool(settings: Settings, name: str) -> ToolDefinition[Any, Any]:
    """The tool ``name`` of the installed plugins the settings allow."""
    try:
        registry = Registry.for_settings(settings)
    except PluginLoadError as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from None
    defn = registry.get(name)
    if defn is None:
        installed = ", ".join(sorted(d.name for d in registry)) or "none"
        raise CommandError(f"no installed plugin provides a tool named {name!r} (installed: {installed})", EXIT_USAGE)
    return defn


def _loading(load: Callable[[Path], Result], root: Path) -> Result:
    """``load(root)``; policies that do not load are a usage error naming the file."""
    try:
        return load(root)
    except PolicyLoadError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
