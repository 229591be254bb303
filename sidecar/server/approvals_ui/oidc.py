"""Signing in through an identity provider: OpenID Connect's authorization code flow with PKCE (RFC 7636).

``begin`` reads the issuer's discovery document (once), keeps a fresh ``state`` with its PKCE code
verifier for ``LOGIN_SECONDS`` and returns the authorization URL the browser is sent to (``S256``
challenge). ``finish`` takes the ``state`` and ``code`` the provider sent back, forgets the state (a login
finishes once), redeems the code with the verifier at the token endpoint (HTTP Basic with a
``client_secret``, else as a public client) and verifies the access token with the sidecar's own
``Authenticator``, as an agent's token is verified: the principal, and the session's end, come from it.
Every failure is an ``AuthenticationError`` with a message safe to show; the details go to the log.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from sidecar.config import OidcSettings
from sidecar.errors import AuthenticationError
from sidecar.server.approvals_ui.sessions import SignedIn
from sidecar.server.approvals_ui.signin import token_expiry
from sidecar.server.auth import Authenticator

__all__ = ["LOGIN_SECONDS", "MAX_PENDING_LOGINS", "OidcSignIn"]

log = logging.getLogger(__name__)

MAX_PENDING_LOGINS = 10_000
LOGIN_SECONDS = 600  # a login started must come back within this
_UNREACHABLE = "the identity provider cannot be reached; try again shortly"


class OidcSignIn:
    """The authorization code flow with one identity provider (``approvals_ui.oidc``)."""

    def __init__(self, settings: OidcSettings, authenticator: Authenticator, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._settings, self._authenticator, self._clock = settings, authenticator, clock
        self._pending: dict[str, tuple[str, float]] = {}  # state: (code verifier, until)
        self._metadata: dict[str, Any] | None = None
        self._http: aiohttp.ClientSession | None = None

    async def begin(self) -> tuple[str, str]:
        """A new login: its ``state`` and the URL of the provider's authorization endpoint to send the browser to."""
        endpoint = await self._endpoint("authorization_endpoint")
        now = self._clock()
        self._pending = {state: kept for state, kept in self._pending.items() if kept[1] > now}
        while len(self._pending) >= MAX_PENDING_LOGINS:
            del self._pending[min(self._pending, key=lambda state: self._pending[state][1])]
        state, verifier = secrets.token_urlsafe(32), secrets.token_urlsafe(64)
        self._pending[state] = (verifier, now + LOGIN_SECONDS)
        query = {"response_type": "code", "client_id": self._settings.client_id,
                 "redirect_uri": self._settings.redirect_uri, "scope": " ".join(self._settings.scopes),
                 "state": state, "code_challenge": _challenge(verifier), "code_challenge_method": "S256"}
        return state, f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"

    async def finish(self, state: str, code: str) -> SignedIn:
        """The person the provider's ``code`` for the login ``state`` proves."""
        pending = self._pending.pop(state, None)
        if pending is None or pending[1] <= self._clock():
            raise AuthenticationError("this sign-in expired or was already used; sign in again")
        if not code:
            raise AuthenticationError("the identity provider sent no authorization code")
        token = await self._redeem(code, pending[0])
        principal = await self._authenticator.authenticate([("authorization", f"Bearer {token}")])
        return SignedIn(principal, "oidc", until=token_expiry(token))

    def forget(self, state: str) -> None:
        """Drop the login ``state`` (the provider refused it)."""
        self._pending.pop(state, None)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def _redeem(self, code: str, verifier: str) -> str:
        """The access token the token endpoint gives for ``code``."""
        endpoint = await self._endpoint("token_endpoint")
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": self._settings.redirect_uri,
                "code_verifier": verifier, "client_id": self._settings.client_id}
        secret, headers = self._settings.client_secret, {}
        if secret is not None:  # client_secret_basic: each part form-encoded first (RFC 6749, 2.3.1)
            login, password = quote(self._settings.client_id, safe=""), quote(secret.get_secret_value(), safe="")
            headers["Authorization"] = aiohttp.encode_basic_auth(login, password)
        body = await self._json("POST", endpoint, data=form, headers=headers)
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            log.warning("OIDC token endpoint %s answered without an access token: %s", endpoint,
                        body.get("error", "no error code"))
            raise AuthenticationError("the identity provider did not issue a token")
        return token

    async def _endpoint(self, name: str) -> str:
        if self._metadata is None:
            url = f"{self._settings.issuer}/.well-known/openid-configuration"
            metadata = await self._json("GET", url)
            if metadata.get("issuer", "").rstrip("/") != self._settings.issuer:
                log.error("OIDC discovery at %s names the issuer %r, not %r", url, metadata.get("issuer"),
                          self._settings.issuer)
                raise AuthenticationError(_UNREACHABLE)
            self._metadata = metadata
        endpoint = self._metadata.get(name)
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            log.error("OIDC discovery of %s has no %s", self._settings.issuer, name)
            raise AuthenticationError(_UNREACHABLE)
        return endpoint

    async def _json(self, method: str, url: str, **request: Any) -> dict[str, Any]:
        """A JSON object from the provider; refusals (4xx with a JSON body) are returned for their caller."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._settings.timeout_seconds))
        try:
            async with self._http.request(method, url, allow_redirects=False, **request) as response:
                body = await response.json(content_type=None)
                if response.status >= 500 or (response.status >= 300 and not isinstance(body, dict)):
                    raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.error("OIDC request %s %s failed: %s", method, url, exc)
            raise AuthenticationError(_UNREACHABLE) from None
        if not isinstance(body, dict):
            log.error("OIDC %s %s answered with no JSON object", method, url)
            raise AuthenticationError(_UNREACHABLE)
        return body


def _challenge(verifier: str) -> str:
    """The PKCE ``S256`` challenge of ``verifier``."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
