"""Who is calling: the principal from trusted gRPC metadata, never from tool arguments.

``jwt`` mode verifies ``authorization: Bearer <jwt>`` (``sidecar.server.jwt_auth``: the configured key or the
issuer's JWKS, algorithm allow-list, issuer and audience, ``exp`` and ``sub`` required); a token longer than
``auth.max_token_bytes`` is refused before anything looks at it. PyJWT and ``cryptography`` load only then.
``dev`` mode returns the configured static principal and ignores any token.
Failures raise ``AuthenticationError`` with a constant message that is safe to send.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sidecar.config import AuthMode, AuthSettings
from sidecar.contract import Principal
from sidecar.errors import AuthenticationError

if TYPE_CHECKING:
    from sidecar.server.jwt_auth import JwtVerifier

__all__ = ["Authenticator", "Metadata"]

Metadata = Sequence[tuple[str, str | bytes]]


class Authenticator:
    """Turns call metadata into a ``Principal`` according to ``AuthSettings``."""

    def __init__(self, settings: AuthSettings) -> None:
        self._dev_principal, self._max_token_bytes = settings.dev_principal, settings.max_token_bytes
        jwt_settings = settings.jwt if settings.effective_mode is AuthMode.JWT else None
        self._jwt: JwtVerifier | None = None
        if jwt_settings is not None:
            from sidecar.server.jwt_auth import JwtVerifier  # PyJWT and cryptography, only with jwt auth

            self._jwt = JwtVerifier(jwt_settings)

    async def authenticate(self, metadata: Metadata) -> Principal:
        """The principal of a call, or ``AuthenticationError`` (waits only when a JWKS must be fetched)."""
        if self._jwt is None:
            return self._dev_principal
        token = _bearer_token(metadata)
        if len(token) > self._max_token_bytes:  # a JWT is ASCII: a character is a byte
            raise AuthenticationError(f"token too large: at most {self._max_token_bytes} bytes (auth.max_token_bytes)")
        return await self._jwt.principal(token)


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
