"""``toolbooth config validate``: load the config file and ``TOOLBOOTH_*`` variables, summarise them.

A configuration that does not load is a ``ConfigError``, which ``main`` turns into exit code 2.
"""

from __future__ import annotations

import argparse

from sidecar.cli.common import EXIT_OK, Subparsers, config_flag
from sidecar.config import Settings, load_settings

__all__ = ["add_commands", "cmd_config_validate", "describe_settings"]


def add_commands(commands: Subparsers) -> None:
    """Add ``config validate`` to the ``toolbooth`` parser."""
    config = commands.add_parser("config", help="check configuration")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="validate the config file and TOOLBOOTH_* variables")
    config_flag(validate)
    validate.set_defaults(handler=cmd_config_validate)


def cmd_config_validate(args: argparse.Namespace) -> int:
    """``toolbooth config validate``: load the settings and summarise them."""
    settings = load_settings(args.config)
    print("config OK")
    print(describe_settings(settings))
    return EXIT_OK


def describe_settings(settings: Settings) -> str:
    """A short summary of the settings that matter when deploying."""
    return "\n".join([
        f"  listen:  {', '.join(settings.server.listen)}",
        f"  auth:    {settings.auth.effective_mode.value}",
        f"  policy:  {settings.policy.engine} {settings.policy.path}",
        f"  store:   {settings.store.describe()}",
    ])
