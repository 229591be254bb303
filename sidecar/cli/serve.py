"""``toolbooth serve``: run the sidecar until SIGTERM/SIGINT.

``--listen`` and ``--policies`` replace what the settings say and are validated like them.
Anything that stops the sidecar from starting is one line on stderr and an exit code
(``sidecar.cli.preflight.failure_exit``): 2 when the configuration, or a key file, policy
directory, bundle, allow-list entry it names, is wrong (checked first, before anything opens);
1 when something it relies on fails (a plugin that does not import, the store, a bundle server,
an address that cannot be bound). With ``server.workers`` above 1 it supervises that many worker processes
(``sidecar.server.supervisor``); one that cannot start fails the command with its error and exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar.cli.common import EXIT_OK, CommandError, Subparsers, config_flag, setup_logging
from sidecar.cli.preflight import STARTUP_FAILURES, check_files_named, failure_exit
from sidecar.config import LISTEN_FORMS, Settings, load_settings, parse_settings
from sidecar.errors import ConfigError

__all__ = ["add_commands", "cmd_serve", "policy_source_override", "serve_settings"]

log = logging.getLogger(__name__)

_URL_SCHEMES = ("http://", "https://")


def add_commands(commands: Subparsers) -> None:
    """Add ``serve`` to the ``toolbooth`` parser."""
    serve = commands.add_parser("serve", help="run the sidecar until SIGTERM/SIGINT")
    config_flag(serve)
    serve.add_argument("--listen", action="append", metavar="ADDRESS",
                       help=f"{LISTEN_FORMS}; repeatable; replaces server.listen")
    serve.add_argument("--policies", metavar="DIR_OR_BUNDLE",
                       help="a policy directory, a bundle file (.tar.gz) or a bundle URL; replaces the configured one")
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """``toolbooth serve``: run the sidecar until SIGTERM/SIGINT."""
    if args.policies and not args.policies.startswith(_URL_SCHEMES) and not Path(args.policies).exists():
        raise ConfigError(f"--policies {args.policies}: no such policy directory or bundle file "
                          "(or give a bundle URL, http:// or https://)")
    settings = serve_settings(args.config, args.listen, args.policies)
    setup_logging(settings.log_level, settings.logging.format)
    try:
        check_files_named(settings)
        if settings.server.workers > 1:
            return _supervise(settings)
        from sidecar.bootstrap import serve  # the server, pipeline and policy engines load only to serve

        asyncio.run(serve(settings))
    except STARTUP_FAILURES as exc:
        log.debug("start-up failed", exc_info=True)
        raise CommandError(str(exc), failure_exit(exc)) from None
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


def _supervise(settings: Settings) -> int:
    """Run ``server.workers`` worker processes until SIGTERM/SIGINT (``sidecar.server.supervisor``)."""
    from sidecar.server.supervisor import WorkerFailed, supervise

    try:
        return asyncio.run(supervise(settings))
    except WorkerFailed as exc:
        raise CommandError(str(exc), exc.exit_code) from None


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
    return parse_settings(raw, origins=settings.origins)


def policy_source_override(policy: dict[str, Any], source: str) -> dict[str, Any]:
    """``policy`` settings whose source is ``source``: a directory, a bundle file or a bundle URL.

    A configured bundle keeps its verification keys and polling; only its location changes.
    """
    bundle = {key: value for key, value in policy.get("bundle", {}).items() if key not in ("url", "file")}
    if source.startswith(_URL_SCHEMES):
        return {**policy, "bundle": {**bundle, "url": source}}
    if Path(source).is_dir():
        return {**{key: value for key, value in policy.items() if key != "bundle"}, "path": source}
    return {**policy, "bundle": {**bundle, "file": source}}
