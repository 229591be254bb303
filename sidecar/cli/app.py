"""The ``toolbooth`` command: ``serve``, ``tools list``, ``call``, ``config validate``, ``policy …``, ``audit …``,
``previews list``, ``approve``, ``deny``, ``operations …``.

A thin shell over ``sidecar.config``, ``sidecar.server.serve`` and
``sidecar.client.Client``: it parses flags, calls one of them, prints the answer
and turns the outcome into an exit code. It makes no decisions of its own; in
particular ``call`` sends ``--args`` text unparsed, because the sidecar is the
validator.

Exit codes: 0 success; 1 start-up failure or gRPC error; 2 usage error or a
configuration that does not load; 3 the call's result is an error; 4 the call
needs approval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sidecar.config import ENV_TARGET, ENV_TOKEN, Settings, load_settings, parse_settings
from sidecar.contract import Status, ToolListing
from sidecar.errors import ConfigError

if TYPE_CHECKING:
    from sidecar.client import Client, ClientError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TOOL_ERROR = 3
EXIT_APPROVAL_REQUIRED = 4

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

log = logging.getLogger(__name__)

_STATUS_EXIT: dict[Status, int] = {
    Status.SUCCESS: EXIT_OK,
    Status.PARTIAL_SUCCESS: EXIT_OK,
    Status.ERROR: EXIT_TOOL_ERROR,
    Status.APPROVAL_REQUIRED: EXIT_APPROVAL_REQUIRED,
}

_CALL_EPILOG = """\
The result is printed as JSON. Exit codes:
  0  status success or partial_success
  1  the request failed (gRPC error, e.g. the sidecar is not running)
  2  usage error (e.g. an unreadable --args file)
  3  status error (see error.code, error.recovery)
  4  status approval_required (an approver must approve the preview first)
"""

Handler = Callable[[argparse.Namespace], int]
Reply = TypeVar("Reply")


class CommandError(Exception):
    """A command failed; ``main`` prints the message and returns ``exit_code``."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolbooth`` command; return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Handler = args.handler
    try:
        return handler(args)
    except CommandError as exc:
        return fail(str(exc), exc.exit_code)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(prog="toolbooth", description="Policy-as-code sidecar for AI-agent tool calls.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_tools(commands)
    _add_call(commands)
    _add_config(commands)
    from sidecar.cli import approvals as approval_cli
    from sidecar.cli import audit as audit_cli
    from sidecar.cli import operations as operations_cli
    from sidecar.cli import policy as policy_cli

    policy_cli.add_commands(commands)
    audit_cli.add_commands(commands)
    approval_cli.add_commands(commands)
    operations_cli.add_commands(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the sidecar until SIGTERM/SIGINT")
    _config_flag(serve)
    serve.add_argument("--listen", action="append", metavar="ADDRESS",
                       help="unix:///path or HOST:PORT; repeatable; replaces server.listen")
    serve.add_argument("--policies", metavar="DIR_OR_BUNDLE",
                       help="a policy directory, a bundle file (.tar.gz) or a bundle URL; replaces the configured one")
    serve.set_defaults(handler=cmd_serve)


def _add_tools(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tools = commands.add_parser("tools", help="discover tools")
    actions = tools.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list the tools this caller may use")
    client_flags(listing)
    listing.add_argument("--output", choices=("table", "json"), default="table", help="default: table")
    listing.set_defaults(handler=cmd_tools_list)


def _add_call(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    call = commands.add_parser("call", help="execute one tool call", epilog=_CALL_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("--args", dest="arguments", default="{}", metavar="JSON",
                      help="arguments as a JSON object, @FILE to read a file, - to read stdin (default: {})")
    call.add_argument("--idempotency-key", metavar="KEY", help="required by tools with side effects")
    call.add_argument("--conversation-id", metavar="ID")
    call.add_argument("--approval-id", metavar="ID", help="the preview_id of an approved preview of this exact call")
    client_flags(call)
    call.add_argument("--timeout", type=float, metavar="SECONDS", help="deadline of the call")
    call.set_defaults(handler=cmd_call)


def _add_config(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = commands.add_parser("config", help="check configuration")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="validate the config file and TOOLBOOTH_* variables")
    _config_flag(validate)
    validate.set_defaults(handler=cmd_config_validate)


def _config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML config file (default: none)")


def client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", metavar="ADDR",
                        help=f"sidecar address (default: ${ENV_TARGET}, else the default server.listen)")
    parser.add_argument("--token", default=os.environ.get(ENV_TOKEN), metavar="TOKEN",
                        help=f"bearer token (default: ${ENV_TOKEN})")


# --- commands ---------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """``toolbooth serve``: run the sidecar until SIGTERM/SIGINT."""
    settings = serve_settings(args.config, args.listen, args.policies)
    setup_logging(settings.log_level)
    from sidecar.server import serve

    try:
        asyncio.run(serve(settings))
    except _startup_errors() as exc:
        log.debug("start-up failed", exc_info=True)
        raise CommandError(str(exc), EXIT_FAILURE) from None
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def cmd_tools_list(args: argparse.Namespace) -> int:
    """``toolbooth tools list``: print the tools this caller may use."""
    listing = with_client(args, lambda client: client.list_tools())
    print(dump_json(listing.model_dump(mode="json")) if args.output == "json" else format_table(listing))
    return EXIT_OK


def cmd_call(args: argparse.Namespace) -> int:
    """``toolbooth call``: execute one call and print its typed result."""
    arguments = read_arguments(args.arguments)
    result = with_client(args, lambda client: client.execute(
        args.tool, arguments, idempotency_key=args.idempotency_key, approval_id=args.approval_id,
        conversation_id=args.conversation_id, timeout=args.timeout))
    print(dump_json(result.model_dump(mode="json")))
    return exit_code(result.status)


def cmd_config_validate(args: argparse.Namespace) -> int:
    """``toolbooth config validate``: load the settings and summarise them."""
    settings = load_settings(args.config)
    print("config OK")
    print(describe_settings(settings))
    return EXIT_OK


# --- helpers ----------------------------------------------------------------------------------------------


def exit_code(status: Status) -> int:
    """The exit code of ``toolbooth call`` for a result with ``status``."""
    return _STATUS_EXIT[status]


def serve_settings(config: Path | None, listen: Sequence[str] | None = None,
                   policies: str | None = None) -> Settings:
    """Load the settings; ``listen`` and ``policies`` (when given) replace theirs and are validated like them."""
    settings = load_settings(config)
    if not listen and not policies:
        return settings
    raw = settings.model_dump(exclude_none=True)
    if listen:
        raw["server"]["listen"] = list(listen)
    if policies:
        raw["policy"] = policy_source_override(raw["policy"], policies)
    return parse_settings(raw)


def policy_source_override(policy: dict[str, Any], source: str) -> dict[str, Any]:
    """``policy`` settings whose source is ``source``: a directory, a bundle file or a bundle URL.

    A configured bundle keeps its verification keys and polling; only its location changes.
    """
    bundle = {key: value for key, value in policy.get("bundle", {}).items() if key not in ("url", "file")}
    if source.startswith(("http://", "https://")):
        return {**policy, "bundle": {**bundle, "url": source}}
    if Path(source).is_dir():
        return {**{key: value for key, value in policy.items() if key != "bundle"}, "path": source}
    return {**policy, "bundle": {**bundle, "file": source}}


def _startup_errors() -> tuple[type[BaseException], ...]:
    """What stops ``serve`` from starting: reported in one line, exit 1.

    ``ConfigError`` here means settings that parse but cannot run (a non-loopback
    address in dev mode, an unreadable JWT key); grpc reports a failed bind as a
    bare ``RuntimeError``.
    """
    from sidecar.errors import PluginLoadError, PolicyLoadError, StoreUnavailableError

    return ConfigError, PluginLoadError, PolicyLoadError, StoreUnavailableError, OSError, RuntimeError


def setup_logging(level: str) -> None:
    """Log to stderr with time, level, logger and message."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)


def default_target() -> str:
    """``$TOOLBOOTH_TARGET``, else the first address ``toolbooth serve`` listens on by default."""
    return os.environ.get(ENV_TARGET) or load_settings(None).server.listen[0]


def read_arguments(value: str) -> str:
    """The ``--args`` text: inline, ``@FILE`` or ``-`` (stdin). Not parsed: the sidecar validates it."""
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            return path.read_text()
        except OSError as exc:
            raise CommandError(f"cannot read --args file {path}: {exc.strerror}", EXIT_USAGE) from None
    return value


def with_client(args: argparse.Namespace, request: Callable[[Client], Reply]) -> Reply:
    """Run ``request`` with a client for ``args.target``; a ``ClientError`` becomes exit code 1."""
    from sidecar.client import Client, ClientError

    target = args.target or default_target()
    try:
        with Client(target, token=args.token) as client:
            return request(client)
    except ClientError as exc:
        raise CommandError(_client_failure(exc, target, explicit=args.target is not None), EXIT_FAILURE) from None


def _client_failure(exc: ClientError, target: str, *, explicit: bool) -> str:
    """``CODE: details``, plus how to start the sidecar when its socket does not exist."""
    message = f"{exc.code.name}: {exc.details}"
    socket = Path(target.removeprefix("unix://")) if target.startswith("unix://") else None
    if socket is not None and not socket.exists():
        start = "toolbooth serve" + (f" --listen {target}" if explicit else "")
        message += f"\nno socket at {socket}: is the sidecar running? start it with `{start}`"
    return message


def describe_settings(settings: Settings) -> str:
    """A short summary of the settings that matter when deploying."""
    return "\n".join([
        f"  listen:  {', '.join(settings.server.listen)}",
        f"  auth:    {settings.auth.effective_mode.value}",
        f"  policy:  {settings.policy.engine} {settings.policy.path}",
        f"  store:   {settings.store.describe()}",
    ])


def format_table(listing: ToolListing) -> str:
    """The tools as an aligned text table."""
    rows = [("NAME", "VERSION", "SIDE EFFECT", "KEY REQUIRED", "TIMEOUT")]
    rows += [(t.name, t.version, t.side_effect.value, "yes" if t.requires_idempotency_key else "no",
              f"{t.timeout_ms / 1000:g}s") for t in listing.tools]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def dump_json(data: Any) -> str:
    """Pretty JSON, 2-space indent, non-ASCII kept readable."""
    return json.dumps(data, indent=2, ensure_ascii=False)


def fail(message: str, code: int) -> int:
    """Print ``toolbooth: error: ...`` (one line per message line) to stderr; return ``code``."""
    for line in message.splitlines() or [""]:
        print(f"toolbooth: error: {line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
