"""What every ``toolbooth`` command group shares: exit codes, ``CommandError``, flags, output, clients, stores.

Exit codes: 0 success; 1 start-up failure, gRPC error or unreadable store; 2 usage error or a
configuration that does not load; 3 the result is an error or a refusal; 4 the call needs approval.
A command fails by raising ``CommandError`` with its exit code; ``sidecar.cli.root.main`` prints it.

Imports nothing from the other ``sidecar.cli`` modules but ``output``, so every group can use it without a cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from sidecar.cli.output import error_document
from sidecar.config import (
    ENV_CONFIG,
    ENV_TARGET,
    ENV_TLS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TLS_SERVER_NAME,
    ENV_TOKEN,
    ListenKind,
    LogFormat,
    client_target,
    load_settings,
    parse_listen,
    socket_path,
)
from sidecar.errors import StoreUnavailableError

if TYPE_CHECKING:
    from sidecar.client import Client, ClientError
    from sidecar.client_tls import ClientTls
    from sidecar.state import Store

__all__ = [
    "EXIT_APPROVAL_REQUIRED",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_TOOL_ERROR",
    "EXIT_USAGE",
    "LOG_FORMAT",
    "TARGET_ORDER",
    "CommandError",
    "Handler",
    "Subparsers",
    "Target",
    "client_flags",
    "client_tls",
    "config_flag",
    "default_target",
    "dump_json",
    "fail",
    "field_flag",
    "find_target",
    "print_result",
    "read_arguments",
    "setup_logging",
    "valid_json",
    "with_client",
    "with_store",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TOOL_ERROR = 3
EXIT_APPROVAL_REQUIRED = 4

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Reply = TypeVar("Reply")


class CommandError(Exception):
    """A command failed; ``main`` prints the message and returns ``exit_code``. ``code`` names the failure in
    the JSON error of ``--output json`` (``sidecar.cli.output``; by default the name of the exit code)."""

    def __init__(self, message: str, exit_code: int, code: str | None = None) -> None:
        super().__init__(message)
        self.exit_code, self.code = exit_code, code


# --- flags ------------------------------------------------------------------------------------------------


def config_flag(parser: argparse.ArgumentParser, help: str = "YAML config file") -> None:
    """``--config FILE``: the YAML config file of the command (default: ``$TOOLBOOTH_CONFIG``)."""
    given = os.environ.get(ENV_CONFIG)
    parser.add_argument("--config", type=Path, default=Path(given) if given else None, metavar="FILE",
                        help=f"{help} (default: ${ENV_CONFIG}, else none)")


# Where a client command looks for the sidecar, first to last: the ``--help`` text and the hints say it.
TARGET_ORDER = f"--target ADDR, else ${ENV_TARGET}, else --config FILE (${ENV_CONFIG}), else the default socket"


def client_flags(parser: argparse.ArgumentParser) -> None:
    """``--target``, ``--config``, ``--token`` and ``--tls*``: where the running sidecar is, who calls it, and how
    its TLS is checked (``find_target``, ``client_tls``)."""
    parser.add_argument("--target", metavar="ADDR",
                        help=f"sidecar address; the sidecar is looked for at {TARGET_ORDER} (a config's first "
                             "server.listen)")
    config_flag(parser, "the sidecar's YAML config file: reach it at its first server.listen, with TLS when "
                        "server.tls is set (--target and $TOOLBOOTH_TARGET come first)")
    parser.add_argument("--token", default=os.environ.get(ENV_TOKEN), metavar="TOKEN",
                        help=f"bearer token (default: ${ENV_TOKEN})")
    tls = parser.add_argument_group("TLS (a TCP target whose sidecar has server.tls; any --tls-* flag implies --tls)")
    tls.add_argument("--tls", action="store_true", help=f"connect with TLS, trusting the system's CAs "
                                                        f"(default: ${ENV_TLS} = 1/true/yes/on)")
    for flag, variable, what in (("--tls-ca", ENV_TLS_CA, "the CA that signed the sidecar's certificate"),
                                 ("--tls-cert", ENV_TLS_CERT, "client certificate, for mutual TLS"),
                                 ("--tls-key", ENV_TLS_KEY, "the client certificate's key")):
        parser_default = os.environ.get(variable)
        tls.add_argument(flag, type=Path, default=Path(parser_default) if parser_default else None, metavar="FILE",
                         help=f"{what} (default: ${variable})")
    tls.add_argument("--tls-server-name", default=os.environ.get(ENV_TLS_SERVER_NAME) or None, metavar="NAME",
                     help=f"the name the sidecar's certificate must carry, when ADDR does not say it "
                          f"(default: ${ENV_TLS_SERVER_NAME})")


def client_tls(args: argparse.Namespace, *, implied: bool = False) -> ClientTls | None:
    """The client's TLS from the ``--tls*`` flags (or their variables), or ``implied`` by the sidecar's config;
    ``None``: plaintext."""
    from sidecar.client_tls import ClientTls  # gRPC loads only for commands that talk to a sidecar

    wanted = (args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    if not (implied or args.tls or _variable_on(ENV_TLS) or any(value is not None for value in wanted)):
        return None
    try:
        return ClientTls(ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key,
                         server_name=args.tls_server_name)
    except ValueError as exc:
        raise CommandError(f"--tls-cert and --tls-key: {exc}", EXIT_USAGE) from None


def _variable_on(name: str) -> bool:
    text = os.environ.get(name, "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise CommandError(f"${name}={os.environ[name]!r}: expected 1, true, yes or on (or 0, false, no, off)", EXIT_USAGE)


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


def valid_json(text: str, flag: str = "--args") -> str:
    """``text`` unchanged when it is JSON; else a usage error saying where it breaks.

    Only the syntax is checked here: the sidecar still receives the text as it was given and
    validates everything else (size, depth, the tool's input model).
    """
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{flag} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
                           f"(character {exc.pos})", EXIT_USAGE) from None
    return text


# --- output -----------------------------------------------------------------------------------------------


def field_flag(parser: argparse.ArgumentParser, example: str) -> None:
    """``--field PATH``: print one field of the printed result (``print_result``)."""
    parser.add_argument("--field", metavar="PATH", help=f"print only this field of the result, e.g. {example} "
                                                        "(a string as it is, anything else as JSON)")


def print_result(result: dict[str, Any], field: str | None, *, as_json: bool = False) -> None:
    """Print ``result`` as JSON, or only the value at the dotted path ``field`` (a string as it is, unless
    ``as_json``: ``--output json`` prints it as a JSON string).

    A path the result lacks is an error (exit 1) that says so, since a script reading the field would
    otherwise go on with an empty value."""
    value: Any = result
    for name in field.split(".") if field is not None else ():
        if not isinstance(value, dict) or name not in value:
            raise CommandError(f"--field {field}: the result has no such field; without --field the whole "
                               f"result is printed", EXIT_FAILURE, "NO_SUCH_FIELD")
        value = value[name]
    print(value if isinstance(value, str) and not as_json else dump_json(value))


def dump_json(data: Any) -> str:
    """Pretty JSON, 2-space indent, non-ASCII kept readable."""
    return json.dumps(data, indent=2, ensure_ascii=False)


def fail(message: str, code: int, *, as_json: bool = False, name: str | None = None) -> int:
    """Print ``toolbooth: error: ...`` (one line per message line) to stderr, or with ``as_json`` the JSON error
    of ``sidecar.cli.output`` (named ``name``); return ``code``."""
    if as_json:
        print(error_document(message, code, name), file=sys.stderr)
        return code
    for line in message.splitlines() or [""]:
        print(f"toolbooth: error: {line}", file=sys.stderr)
    return code


def setup_logging(level: str, format: LogFormat = LogFormat.TEXT) -> None:
    """Log to stderr: text lines with time, level, logger and message, or JSON lines
    (``sidecar.telemetry.logs``)."""
    if format is LogFormat.JSON:
        from sidecar.telemetry.logs import setup_json_logging  # structlog loads only for JSON lines

        setup_json_logging(level)
        return
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)


# --- a running sidecar, or the store directly ---------------------------------------------------------------


def default_target() -> str:
    """``$TOOLBOOTH_TARGET``, else the first address ``toolbooth serve`` listens on by default."""
    return os.environ.get(ENV_TARGET) or load_settings(None).server.listen[0]


@dataclass(frozen=True)
class Target:
    """Where a client command finds the sidecar: its ``address``, where that came from (``origin``, for messages),
    and whether the config it came from (``config``) serves TLS there (``tls``)."""

    address: str
    origin: str
    explicit: bool = False  # the caller named the address: --target or $TOOLBOOTH_TARGET
    tls: bool = False
    config: Path | None = None


def find_target(args: argparse.Namespace) -> Target:
    """The sidecar ``args`` point at, in the order of ``TARGET_ORDER``: from a config, its first listener (a TCP
    one reached on loopback when it listens on any address), with TLS when ``server.tls`` is set."""
    if args.target:
        return Target(args.target, "--target", explicit=True)
    if given := os.environ.get(ENV_TARGET):
        return Target(given, f"${ENV_TARGET}", explicit=True)
    config: Path | None = args.config
    settings = load_settings(config)
    origin = f"the first server.listen of {config}" if config is not None else "the default socket"
    if (variable := settings.origins.get(("server", "listen"))) is not None:
        origin = f"the first server.listen, from ${variable}"
    listen = settings.server.listen[0]
    try:
        address = client_target(listen)
    except ValueError as exc:
        raise CommandError(f"{origin}: {exc}: give --target HOST:PORT", EXIT_USAGE) from None
    tls = settings.server.tls is not None and parse_listen(listen).kind is ListenKind.TCP
    return Target(address, origin, tls=tls, config=config)


def with_client(args: argparse.Namespace, request: Callable[[Client], Reply]) -> Reply:
    """Run ``request`` with a client for the sidecar of ``find_target``; a ``ClientError`` becomes exit code 1."""
    from sidecar.client import Client, ClientError  # gRPC loads only for commands that talk to a sidecar

    target = find_target(args)
    tls = client_tls(args, implied=target.tls)
    try:
        client = Client(target.address, token=args.token, tls=tls)
    except ValueError as exc:  # a TLS file that cannot be read, TLS towards a Unix socket
        raise CommandError(str(exc), EXIT_USAGE) from None
    try:
        with client:
            return request(client)
    except ClientError as exc:
        raise CommandError(_client_failure(exc, target, tls=tls), EXIT_FAILURE, exc.code.name) from None


# What gRPC says of a failed handshake, and what the caller can do about it.
_TLS_HINTS = (
    ("CERTIFICATE_VERIFY_FAILED", "the sidecar's certificate is not trusted: give the CA that signed it with "
                                  f"--tls-ca FILE (${ENV_TLS_CA}), or its name with --tls-server-name"),
    ("WRONG_VERSION_NUMBER", "the sidecar does not serve TLS at this address: leave out --tls"),
)


def _client_failure(exc: ClientError, target: Target, *, tls: ClientTls | None) -> str:
    """``CODE: details``, plus what to do about a failed TLS handshake, or where the sidecar was looked for and
    how to start it when nothing answers there."""
    message = f"{exc.code.name}: {exc.details}"
    hints = [hint for marker, hint in _TLS_HINTS if marker in exc.details]
    socket = socket_path(target.address)
    if not hints and socket is None and "Socket closed" in exc.details:  # the server ended the handshake
        if tls is None:
            hints.append("if the sidecar serves TLS at this address (server.tls), connect with --tls and --tls-ca FILE")
        elif tls.cert_file is None:
            hints.append("if the sidecar requires client certificates (server.tls.client_ca_file), give "
                         "--tls-cert FILE and --tls-key FILE")
    if socket is not None:
        hints.extend(_socket_hints(socket, target, exc.details))
    elif "Connection refused" in exc.details:
        hints.append(f"{_looked_for(target)}; nothing answers at {target.address}: is the sidecar running? "
                     f"start it with `{_start(target)}`")
    return message + "".join(f"\n{hint}" for hint in hints)


def _socket_hints(socket: Path, target: Target, details: str) -> list[str]:
    """Why a Unix socket could not be reached: this user may not search its directory or connect to it, or it
    does not exist (then where the sidecar was looked for, and how to start it)."""
    try:
        present = socket.exists()
    except PermissionError:  # a directory on the way this user may not search
        return [_NO_ACCESS.format(what=f"the directory of {socket}")]
    if "Permission denied" in details:
        return [_NO_ACCESS.format(what=socket)]
    if present:
        return []
    relative = "" if socket.is_absolute() else (f" (a relative socket path is read against the working directory, "
                                                f"here {Path.cwd()}, as the sidecar reads it against its own)")
    return [f"{_looked_for(target)}; no socket at {socket}{relative}: is the sidecar running? start it with "
            f"`{_start(target)}`"]


def _looked_for(target: Target) -> str:
    return f"the sidecar is looked for at {TARGET_ORDER}: here {target.origin}"


def _start(target: Target) -> str:
    """The command that starts a sidecar where ``target`` looks (``--listen`` only when ``serve`` accepts the
    address as it is)."""
    if target.explicit and _listenable(target.address):
        return f"toolbooth serve --listen {target.address}"
    return "toolbooth serve" + (f" --config {target.config}" if target.config is not None else "")


_NO_ACCESS = ("permission denied: this user may not reach {what}; the sidecar makes its socket 0660 in a 0750 "
              "directory: run as its user or in its group")


def _listenable(target: str) -> bool:
    try:
        parse_listen(target)
    except ValueError:
        return False
    return True


def with_store(config: Path | None, use: Callable[[Store], Awaitable[Reply]]) -> Reply:
    """Open the store of ``config``, run ``use`` on it, close it; an unreadable store is exit 1."""
    from sidecar.state.factory import open_store  # the store drivers load only for commands that read one

    async def run() -> Reply:
        store = await open_store(load_settings(config).store)
        try:
            return await use(store)
        finally:
            await store.aclose()

    try:
        return asyncio.run(run())
    except StoreUnavailableError as exc:
        raise CommandError(str(exc), EXIT_FAILURE, "STORE_UNAVAILABLE") from None
