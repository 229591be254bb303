"""Sign-in methods of the approval inbox: who a person is, proved as the RPCs prove it.

``token``: the person pastes a bearer JWT once; the sidecar's own ``Authenticator`` verifies it exactly as
for a gRPC call (key or JWKS, algorithms, issuer, audience, expiry) and the session ends when the token
does. ``dev``: in dev mode (loopback only) the person continues as the configured dev principal. The token
is used once, here, and never stored, logged or sent back. ``oidc`` (``sidecar.server.approvals_ui.oidc``):
through the identity provider of ``approvals_ui.oidc``.
"""

from __future__ import annotations

import sys
from typing import Any

import jwt

from sidecar.config import AuthMode, AuthSettings
from sidecar.errors import AuthenticationError
from sidecar.server.approvals_ui.sessions import SignedIn
from sidecar.server.auth import Authenticator

__all__ = ["SignIn", "token_expiry"]


class SignIn:
    """Turns what a sign-in form sent into a ``SignedIn``, or ``AuthenticationError`` with a message safe to show."""

    def __init__(self, auth: AuthSettings, authenticator: Authenticator) -> None:
        self.method = "dev" if auth.effective_mode is AuthMode.DEV else "token"
        self._authenticator = authenticator

    async def sign_in(self, token: str | None) -> SignedIn:
        """The person ``token`` proves (dev mode: the dev principal, no token needed)."""
        if self.method == "dev":
            return SignedIn(await self._authenticator.authenticate([]), "dev")
        token = (token or "").strip().removeprefix("Bearer ").strip()
        if not token:
            raise AuthenticationError("paste a token to sign in")
        principal = await self._authenticator.authenticate([("authorization", f"Bearer {token}")])
        return SignedIn(principal, "token", until=token_expiry(token))


def token_expiry(token: str) -> float:
    """The ``exp`` of a token the authenticator has just verified (it requires one, a JSON number); one too
    large for a float is read as the largest float (the session's own end comes first anyway)."""
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return float(min(claims["exp"], sys.float_info.max))
