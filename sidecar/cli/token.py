"""``toolbooth token``: sign a short-lived JWT with the sidecar's own HMAC secret, for development and tests.

A deployment with an identity provider gets its tokens there; a sidecar configured with ``auth.jwt`` and an
``HS*`` algorithm verifies tokens signed with a shared secret (``key`` or ``key_file``), and this command signs
one with that secret, with the issuer, audience and claim names of the same configuration, so that what it
prints is exactly what that sidecar accepts. It refuses any other configuration: an RS/ES key's private half
is never the sidecar's, and a JWKS is the issuer's. Exit codes: 0 printed, 2 the configuration cannot sign.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from sidecar.cli.common import EXIT_OK, EXIT_USAGE, CommandError, Subparsers, config_flag, dump_json
from sidecar.cli.output import json_output, output_flag
from sidecar.config import AuthMode, load_settings
from sidecar.config.auth import JwtSettings

__all__ = ["add_commands", "cmd_token", "sign_token"]

MAX_TTL_SECONDS = 24 * 3600


def add_commands(commands: Subparsers) -> None:
    """Add ``token`` to the ``toolbooth`` parser."""
    token = commands.add_parser("token", help="sign a development JWT with the configured HMAC secret (auth.jwt, HS*)")
    config_flag(token)
    token.add_argument("--subject", required=True, metavar="ID", help="the principal id (the sub claim)")
    token.add_argument("--tenant", default="", metavar="T", help="the principal's tenant (default: none)")
    token.add_argument("--role", dest="roles", action="append", default=[], metavar="ROLE",
                       help="a role of the principal (repeatable)")
    token.add_argument("--permission", dest="permissions", action="append", default=[], metavar="P",
                       help="a permission held directly (repeatable)")
    token.add_argument("--ttl", type=float, default=3600.0, metavar="SECONDS",
                       help=f"seconds until it expires (default: 3600, at most {MAX_TTL_SECONDS})")
    output_flag(token)
    token.set_defaults(handler=cmd_token)


def cmd_token(args: argparse.Namespace) -> int:
    """``toolbooth token``: print the signed token on stdout."""
    if not 0 < args.ttl <= MAX_TTL_SECONDS:
        raise CommandError(f"--ttl {args.ttl:g}: expected more than 0 and at most {MAX_TTL_SECONDS} seconds",
                           EXIT_USAGE)
    if not args.subject.strip():
        raise CommandError("--subject must not be empty", EXIT_USAGE)
    settings = load_settings(args.config)
    jwt_settings = settings.auth.jwt
    if settings.auth.effective_mode is not AuthMode.JWT or jwt_settings is None:
        raise CommandError("the configuration is in dev mode: there is no key to sign with (set auth.mode: jwt with "
                           "auth.jwt and an HS256/HS384/HS512 algorithm, and pass that file with --config)",
                           EXIT_USAGE)
    now = time.time()
    signed = sign_token(jwt_settings, subject=args.subject, tenant=args.tenant, roles=args.roles,
                        permissions=args.permissions, ttl_seconds=args.ttl, now=now)
    if json_output(args):
        expires = dt.datetime.fromtimestamp(int(now) + int(args.ttl), dt.UTC).isoformat(timespec="seconds")
        print(dump_json({"token": signed, "subject": args.subject, "expires_at": expires}))
    else:
        print(signed)
    return EXIT_OK


def sign_token(settings: JwtSettings, *, subject: str, tenant: str, roles: list[str], permissions: list[str],
               ttl_seconds: float, now: float | None = None) -> str:
    """A token ``settings`` verifies: its first HMAC algorithm, issuer, audience and claim names."""
    algorithm = next((a for a in settings.algorithms if a.startswith("HS")), None)
    if algorithm is None or settings.jwks_url is not None:
        raise CommandError(f"auth.jwt verifies {', '.join(settings.algorithms)} tokens"
                           f"{' from ' + settings.jwks_url if settings.jwks_url else ''}: only a shared HMAC secret "
                           "(an HS* algorithm with key or key_file) can sign here; get the token from its issuer",
                           EXIT_USAGE)
    import jwt  # PyJWT loads for this command only, not for every command the CLI parses
    from jwt.algorithms import get_default_algorithms

    secret = settings.verification_key()
    try:
        get_default_algorithms()[algorithm].prepare_key(secret)
    except jwt.InvalidKeyError as exc:  # e.g. a PEM key configured for HS*: the sidecar would not verify with it
        raise CommandError(f"auth.jwt: the key cannot be an {algorithm} secret: {exc}", EXIT_USAGE) from None
    issued = int(time.time() if now is None else now)
    claims = {"iss": settings.issuer, "aud": settings.audience, "sub": subject, "iat": issued,
              "exp": issued + int(ttl_seconds), settings.tenant_claim: tenant, settings.roles_claim: roles,
              settings.permissions_claim: permissions}
    return jwt.encode(claims, secret, algorithm=algorithm)
