"""Who is calling: the principal from trusted gRPC metadata, never from tool arguments.

``jwt`` mode verifies ``authorization: Bearer <jwt>`` against the configured key (or the key its
``kid`` names in the issuer's JWKS: ``sidecar.server.jwks``), algorithm allow-list, issuer and
audience, and requires ``exp`` and ``sub`` (``exp``, ``nbf`` and ``iat`` JSON numbers); a token longer than
``auth.max_token_bytes`` is refused before anything looks at it.
``dev`` mode returns the configured static principal and ignores any token.
Failures raise ``AuthenticationError`` with a constant message that is safe to send.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jwt
from jwt.algorithms import get_default_algorithms

from sidecar.config import AuthMode, AuthSettings, JwtSettings
from sidecar.contract import Principal
from sidecar.errors import AuthenticationError, ConfigError
from sidecar.server.jwks import JwksKeys

__all__ = ["Authenticator", "Metadata"]

log = logging.getLogger(__name__)

Metadata = Sequence[tuple[str, str | bytes]]

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


class Authenticator:
    """Turns call metadata into a ``Principal`` according to ``AuthSettings``."""

    def __init__(self, settings: AuthSettings) -> None:
        self._dev_principal, self._max_token_bytes = settings.dev_principal, settings.max_token_bytes
        jwt_settings = settings.jwt if settings.effective_mode is AuthMode.JWT else None
        self._jwt = None if jwt_settings is None else _JwtVerifier(jwt_settings)

    async def authenticate(self, metadata: Metadata) -> Principal:
        """The principal of a call, or ``AuthenticationError`` (waits only when a JWKS must be fetched)."""
        if self._jwt is None:
            return self._dev_principal
        token = _bearer_token(metadata)
        if len(token) > self._max_token_bytes:  # a JWT is ASCII: a character is a byte
            raise AuthenticationError(f"token too large: at most {self._max_token_bytes} bytes (auth.max_token_bytes)")
        return await self._jwt.principal(token)


class _JwtVerifier:
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


def _bearer_token(metadata: Metadata) -> str:
    values = [value for key, value in metadata if key.lower() == "authorization"]
    if not values:
        raise AuthenticationError("missing bearer token")
    if len(values) > 1 or not isinstance(values[0], str):
        raise AuthenticationError("malformed authorization header")
    scheme, _, token = values[0].strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise AuthenticationError("malformed authorization header")
    return token


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
