"""Keys from the issuer's JWKS (``auth.jwt.jwks_url``): PyJWT's ``PyJWKClient``, off the event loop and bounded.

``PyJWKClient`` fetches the key set, keeps it ``jwks_cache_seconds`` and fetches it again for a ``kid``
it does not hold, at most once per ``jwks_min_refresh_seconds`` (its cooldown). Around it:

- the key of a ``kid`` the fresh cached set holds is found on the event loop: no thread, no fetch;
- whatever may fetch runs on one thread of its own (``jwks_timeout_seconds`` per fetch), never on the
  loop; calls needing the set at once queue for that thread, and the first one's fetch serves the rest;
- a failed fetch (the server down or slow, an answer that is not a key set) is not tried again for
  ``jwks_min_refresh_seconds``: meanwhile a call that needs a fetch is refused at once;
- a set older than ``jwks_cache_seconds`` is never used (a key the issuer withdrew stops verifying).

So it fails closed: a token whose key cannot be had is refused (``AuthenticationError``, gRPC
UNAUTHENTICATED), however the fetch failed. ``kid`` picks the key; the key's algorithm (its ``alg``, else
its type's default) must be the token's and one of ``auth.jwt.algorithms``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jwt
from jwt import PyJWK, PyJWKClient, PyJWKSet

from sidecar import __version__
from sidecar.config import JwtSettings
from sidecar.errors import AuthenticationError

__all__ = ["KEYS_UNAVAILABLE", "JwksKeys"]

log = logging.getLogger(__name__)

KEYS_UNAVAILABLE = "cannot verify the token: signing keys unavailable"


class JwksKeys:
    """The signing keys of one JWKS URL, by ``kid``."""

    def __init__(self, settings: JwtSettings) -> None:
        assert settings.jwks_url is not None
        context = None if settings.jwks_ca_file is None else ssl.create_default_context(
            cafile=str(settings.jwks_ca_file))
        self._client = _Client(settings.jwks_url, cache_jwk_set=True, lifespan=settings.jwks_cache_seconds,
                               timeout=settings.jwks_timeout_seconds, ssl_context=context,
                               cooldown_duration=settings.jwks_min_refresh_seconds,
                               headers={"User-Agent": f"toolbooth/{__version__}"})
        self._retry_after = settings.jwks_min_refresh_seconds
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolbooth-jwks")

    async def key(self, kid: object) -> PyJWK:
        """The key named ``kid``; ``AuthenticationError`` when there is none or the set cannot be had."""
        if not isinstance(kid, str) or not kid:
            raise AuthenticationError("invalid token")  # a key of a set is chosen by its kid
        cached = self._cached(kid)
        if cached is not None:
            return cached
        if self._failing():
            raise AuthenticationError(KEYS_UNAVAILABLE)
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._lookup, kid)

    def _cached(self, kid: str) -> PyJWK | None:
        cache = self._client.jwk_set_cache
        keys = cache.get() if cache is not None else None  # None when empty or older than its lifespan
        if not isinstance(keys, PyJWKSet):
            return None
        # As PyJWKClient.get_signing_key chooses: by kid, among the keys for signatures
        return next((key for key in keys.keys if key.key_id == kid and key.public_key_use in ("sig", None)), None)

    def _failing(self) -> bool:
        failed_at = self._client.failed_at
        return failed_at is not None and time.monotonic() - failed_at < self._retry_after

    def _lookup(self, kid: str) -> PyJWK:
        """On the JWKS thread: the key, fetching the set when the client's cache and cooldown say so."""
        if self._failing():  # a call queued behind the fetch that failed
            raise AuthenticationError(KEYS_UNAVAILABLE)
        fetches = self._client.fetches
        try:
            return self._client.get_signing_key(kid)
        except (jwt.PyJWTError, OSError, ValueError) as exc:
            if self._client.fetches != fetches and self._client.failed_at is not None:  # this lookup's fetch failed
                log.warning("cannot fetch the JWKS %s (tried again in %g s at the earliest): %s", self._client.uri,
                            self._retry_after, exc)
                raise AuthenticationError(KEYS_UNAVAILABLE) from None
            log.debug("token rejected: %s", exc)  # no such kid, even after a refresh (or within the cooldown)
            raise AuthenticationError("invalid token") from None


class _Client(PyJWKClient):
    """``PyJWKClient`` counting its fetches and noting when the last one failed (any way: unreachable, not
    JSON, not a usable key set)."""

    fetches = 0
    failed_at: float | None = None

    def fetch_data(self) -> Any:
        self.fetches += 1
        try:
            data = super().fetch_data()
        except Exception:
            self.failed_at = time.monotonic()
            raise
        self.failed_at = None
        return data

