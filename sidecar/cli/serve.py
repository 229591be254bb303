"""``toolbooth serve``: run the sidecar until SIGTERM/SIGINT.

``--listen`` and ``--policies`` replace what the settings say and are validated like them;
anything that stops the sidecar from starting is one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar.cli.common import EXIT_FAILURE, EXIT_OK, CommandError, Subparsers, config_flag, setup_logging
from sidecar.config import Settings, load_settings, parse_settings
from sidecar.errors import ConfigError, PluginLoadError, PolicyLoadError, StoreUnavailableError

__all__ = ["add_commands", "cmd_serve", "policy_source_override", "serve_settings"]

log = logging.getLogger(__name__)

# What stops ``serve`` from starting: reported in one line, exit 1. ``ConfigError`` here means settings
# that parse but cannot run (a non-loopback address in dev mode, an unreadable JWT key); grpc reports a
# failed bind as a bare ``RuntimeError``.
_STARTUP_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, PluginLoadError, PolicyLoadError, StoreUnavailableError, OSError, RuntimeError)


def add_commands(commands: Subparsers) -> None:
    """Add ``serve`` to the ``toolbooth`` parser."""
    serve = commands.add_parser("serve", help="run the sidecar until SIGTERM/SIGINT")
    config_flag(serve)
    serve.add_argument("--listen", action="append", metavar="ADDRESS",
                       help="unix:///path or HOST:PORT; repeatable; replaces server.listen")
    serve.add_argument("--policies", metavar="DIR_OR_BUNDLE",
                       help="a policy directory, a bundle file (.tar.gz) or a bundle URL; replaces the configured one")
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """``toolbooth serve``: run the sidecar until SIGTERM/SIGINT."""
    settings = serve_settings(args.config, args.listen, args.policies)
    setup_logging(settings.log_level)
    from sidecar.server import serve  # the server, pipeline and policy engines load only to serve

    try:
        asyncio.run(serve(settings))
    except _STARTUP_ERRORS as exc:
        log.debug("start-up failed", exc_info=True)
        raise CommandError(str(exc), EXIT_FAILURE) from None
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


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
