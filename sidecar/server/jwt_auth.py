"""Bearer tokens verified with PyJWT (``auth.mode: jwt``): imported only when that mode is configured.

Verifies against the configured key (or the key its ``kid`` names in the issuer's JWKS: ``sidecar.server.jwks``),
algorithm allow-list, issuer and audience, and requires ``exp`` and ``sub`` (``exp``, ``nbf`` and ``iat`` JSON
numbers). Failures raise ``AuthenticationError`` with a constant message that is safe to send.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jwt
from jwt.algorithms import get_default_algorithms

from sidecar.config import JwtSettings
from sidecar.contract import Principal
from sidecar.errors import AuthenticationError, ConfigError
from sidecar.server.jwks import JwksKeys

__all__ = ["JwtVerifier"]

log = logging.getLogger("sidecar.server.auth")  # the name its lines had before this module was split off

_REQUIRED_CLAIMS = ["exp", "iss", "aud", "sub"]
_NUMERIC_DATES = ("exp", "nbf", "iat")

# Most specific first: the first matching class decides the message.
_MESSAGES: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "token expired"),
    (jwt.ImmatureSignatureError, "token not yet valid"),
    (jwt.InvalidAudienceError, "invalid token audience"),
    (jwt.InvalidIssuerError, "invalid token issuer"),
    (jwt.PyJWTError, "invalid token"),
)


class JwtVerifier:
    """Verifies bearer tokens with keys prepared once, one per usable algorithm, or from a JWKS."""

    def __init__(self, settings: JwtSettings) -> None:
        self._settings = settings
        self._jwks = JwksKeys(settings) if settings.jwks_url is not None else None
        self._keys = _prepare_keys(settings) if self._jwks is None else {}
        if self._keys:
            log.debug("JWT algorithms usable with the configured key: %s", ", ".join(self._keys))

    async def principal(self, token: str) -> Principal:
        """Verify ``token`` and build the principal from its claims."""
        key: jwt.PyJWK | None = None
        if self._jwks is not None:
            try:  # before any key is looked up (and maybe fetched): a header that could never verify
                header = jwt.get_unverified_header(token)
                if header.get("alg") not in self._settings.algorithms:
                    raise jwt.InvalidAlgorithmError("algorithm not allowed")
            except jwt.PyJWTError as exc:
                log.debug("token rejected: %s", exc)
                raise AuthenticationError(_message(exc)) from None
            key = await self._jwks.key(header.get("kid"))
        claims = self._verify(token, key)
        return _principal_from(claims, self._settings)

    def _verify(self, token: str, jwk: jwt.PyJWK | None) -> dict[str, Any]:
        """The claims of ``token``, verified with ``jwk`` (from the JWKS), else with the configured key."""
        try:
            if jwk is not None:
                # PyJWT verifies with the JWK's own algorithm, which must be the header's and one of ours.
                key, algorithms = jwk, list(self._settings.algorithms)
            else:
                algorithm = jwt.get_unverified_header(token).get("alg")
                if not isinstance(algorithm, str) or algorithm not in self._keys:
                    raise jwt.InvalidAlgorithmError("algorithm not allowed")
                # The key was parsed for this allowed algorithm, so the header cannot choose another key type.
                key, algorithms = self._keys[algorithm], [algorithm]
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                issuer=self._settings.issuer,
                audience=self._settings.audience,
                leeway=self._settings.leeway_seconds,
                options={"require": _REQUIRED_CLAIMS},
            )
        except (jwt.ExpiredSignatureError, jwt.ImmatureSignatureError) as exc:
            # Raised once the signature verified: a date that is no number (``false`` read as 0) says so first.
            _check_numeric_dates(jwt.decode(token, options={"verify_signature": False}))
            log.debug("token rejected: %s", exc)
            raise AuthenticationError(_message(exc)) from None
        except jwt.PyJWTError as exc:
            log.debug("token rejected: %s", exc)
            raise AuthenticationError(_message(exc)) from None
        _check_numeric_dates(claims)
        return claims


def _prepare_keys(settings: JwtSettings) -> dict[str, Any]:
    """Map each allowed algorithm that accepts the configured key to the parsed key.

    An algorithm the key does not fit is dropped, so an RSA public key can never be
    used as an HMAC secret (the key-confusion attack).
    """
    pem = settings.verification_key()
    available = get_default_algorithms()
    keys: dict[str, Any] = {}
    for name in settings.algorithms:
        try:
            key = available[name].prepare_key(pem)
        except (jwt.InvalidKeyError, TypeError, ValueError):
            continue
        # A private key configured by mistake still verifies through its public half.
        keys[name] = key.public_key() if hasattr(key, "public_key") else key
    if not keys:
        algorithms = ", ".join(settings.algorithms)
        raise ConfigError(f"config error at auth.jwt: the key fits none of the algorithms {algorithms}")
    return keys


def _message(exc: jwt.PyJWTError) -> str:
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"token is missing the {exc.claim} claim"
    return next(message for kind, message in _MESSAGES if isinstance(exc, kind))


def _check_numeric_dates(claims: Mapping[str, Any]) -> None:
    """RFC 7519: ``exp``, ``nbf`` and ``iat`` are JSON numbers. PyJWT reads them with ``int()``, which takes a
    numeric string (``"9999999999"``) or ``true`` too; such a token is refused."""
    for name in _NUMERIC_DATES:
        value = claims.get(name)
        if name in claims and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise AuthenticationError(f"invalid token claim {name}")


def _principal_from(claims: Mapping[str, Any], settings: JwtSettings) -> Principal:
    subject, tenant = claims.get("sub"), claims.get(settings.tenant_claim, "")
    if not isinstance(subject, str) or not subject:
        raise AuthenticationError("invalid token subject")
    if not isinstance(tenant, str):
        raise AuthenticationError(f"invalid token claim {settings.tenant_claim}")
    return Principal(
        id=subject,
        tenant=tenant,
        roles=_strings(claims, settings.roles_claim, space_separated=False),
        permissions=_strings(claims, settings.permissions_claim, space_separated=True),
    )


def _strings(claims: Mapping[str, Any], name: str, *, space_separated: bool) -> tuple[str, ...]:
    """A list-of-strings claim; a ``scope``-style string too when ``space_separated``."""
    value = claims.get(name)
    if value is None:
        return ()
    if space_separated and isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise AuthenticationError(f"invalid token claim {name}")
