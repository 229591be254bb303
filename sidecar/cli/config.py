"""``toolbooth config validate``: every check ``toolbooth serve`` makes before it listens, without listening.

The file and ``TOOLBOOTH_*`` variables must load, then ``sidecar.cli.preflight`` checks what they
name: keys, policies, plugins, store. Exit codes are those ``serve`` would exit with: 0 it would
start (up to binding its addresses, which is not tried); 2 the configuration, or a file or policy
it names, is wrong; 1 something it relies on fails (a plugin that does not import, the store or a
bundle server that cannot be reached).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from typing import Any

from sidecar.cli.common import EXIT_OK, CommandError, Subparsers, config_flag, dump_json
from sidecar.cli.output import json_output, output_flag
from sidecar.cli.preflight import STARTUP_FAILURES, Checked, failure_exit, preflight
from sidecar.config import Settings, load_settings
from sidecar.config.endpoints import ENDPOINTS

__all__ = ["add_commands", "cmd_config_validate", "describe_settings", "validation_document"]


def add_commands(commands: Subparsers) -> None:
    """Add ``config validate`` to the ``toolbooth`` parser."""
    config = commands.add_parser("config", help="check configuration")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="check the config file, TOOLBOOTH_* variables and what they name "
                                                   "(keys, policies, plugins, store) as serve would")
    config_flag(validate)
    output_flag(validate)
    validate.set_defaults(handler=cmd_config_validate)


def cmd_config_validate(args: argparse.Namespace) -> int:
    """``toolbooth config validate``: load the settings, run serve's checks, summarise."""
    settings = load_settings(args.config)
    try:
        checked = asyncio.run(preflight(settings))
    except STARTUP_FAILURES as exc:
        raise CommandError(str(exc), failure_exit(exc), type(exc).__name__) from None
    if json_output(args):
        print(dump_json(validation_document(settings, checked)))
        return EXIT_OK
    print("config OK")
    print(describe_settings(settings))
    print("\n".join(checked.lines()))
    return EXIT_OK


def validation_document(settings: Settings, checked: Checked) -> dict[str, Any]:
    """What ``config validate`` prints, as JSON data (what it failed on is a JSON error instead)."""
    server, jwt = settings.server, settings.auth.jwt
    return {"ok": True, "listen": list(server.listen),
            "tls": None if server.tls is None else ("mutual" if server.tls.mutual else "server"),
            "health_listen": server.health_listen,
            "mcp": next(row.url(settings) for row in ENDPOINTS if row.section == "mcp"),
            "endpoints": {row.section: url for row in ENDPOINTS if (url := row.url(settings)) is not None},
            "metrics": _metrics(settings), "workers": server.workers,
            "workers_auto": None if (auto := server.workers_auto) is None else asdict(auto),
            "audit_chain": "keyed" if _chain_keyed(settings) else "unkeyed",
            "auth": {"mode": settings.auth.effective_mode.value, "jwks_url": jwt.jwks_url if jwt else None},
            "plugins": [asdict(plugin) for plugin in checked.plugins], "tools": list(checked.tools),
            "isolated": checked.isolated, "policy": checked.policy, "store": checked.store}


def describe_settings(settings: Settings) -> str:
    """Where it would listen (metrics, and the number of workers, even when off or one), how it authenticates,
    whether the audit chain is keyed (the checks add plugins, tools, policy and store)."""
    server, jwt = settings.server, settings.auth.jwt
    tls = "" if server.tls is None else (" (TLS on TCP, client certificates required)" if server.tls.mutual
                                         else " (TLS on TCP)")
    keys = f", keys from {jwt.jwks_url} (not fetched here)" if jwt is not None and jwt.jwks_url else ""
    return "\n".join([
        f"  listen:   {', '.join(server.listen)}{tls}",
        *([f"  health:   {server.health_listen} (health only, plaintext)"] if server.health_listen else []),
        *(f"  {row.section + ':':<9} {url}" for row in ENDPOINTS if (url := row.url(settings)) is not None),
        *([] if _metrics(settings) else ["  metrics:  off (metrics.listen not set)"]),
        f"  workers:  {_workers(settings)}",
        f"  auth:     {settings.auth.effective_mode.value}{keys}",
        f"  audit:    chain {'keyed' if _chain_keyed(settings) else 'unkeyed (no audit.chain_key)'}",
    ])


def _workers(settings: Settings) -> str:
    """``2``; with ``workers: auto``, what it counted: ``auto (2: cgroup cpu.max 200000/100000 in /sys/fs/cgroup)``."""
    server = settings.server
    if (auto := server.workers_auto) is None:
        return str(server.workers)
    capped = f", at most {server.workers}" if auto.cpus > server.workers else ""
    return f"auto ({server.workers}: {auto.source}{capped})"


def _metrics(settings: Settings) -> str | None:
    """The metrics endpoint's address, ``None`` when off."""
    return next(row.url(settings) for row in ENDPOINTS if row.section == "metrics")


def _chain_keyed(settings: Settings) -> bool:
    """Whether the audit chain is keyed (preflight has read the key already)."""
    return settings.audit.chain_key is not None or settings.audit.chain_key_file is not None
