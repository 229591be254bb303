"""Keys from the issuer's JWKS (``auth.jwt.jwks_url``), fetched on the event loop, each whole fetch bounded.

- the key of a ``kid`` the fresh cached set holds is found at once: no fetch;
- a set older than ``jwks_cache_seconds`` is never used (a key the issuer withdrew stops verifying);
- a ``kid`` the set lacks fetches it again, at most once per ``jwks_min_refresh_seconds`` after the last fetch;
- one fetch at a time, a task of the loop (no thread): calls that need the set while it runs wait for it;
- ``jwks_timeout_seconds`` bounds the whole fetch (connecting, TLS, the answer's headers and its body of at
  most ``MAX_SET_BYTES``), so a server that drips its answer is cut off like one that is silent;
- a failed fetch is not tried again for ``jwks_min_refresh_seconds``: meanwhile a call that needs a fetch
  is refused at once.

So it fails closed: a token whose key cannot be had is refused (``AuthenticationError``, gRPC
UNAUTHENTICATED), however the fetch failed. ``kid`` picks the key (PyJWT's ``PyJWKSet``); the key's algorithm
(its ``alg``, else its type's default) must be the token's and one of ``auth.jwt.algorithms``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time

import aiohttp
import jwt
from jwt import PyJWK, PyJWKSet

from sidecar.config import JwtSettings
from sidecar.downloads import download
from sidecar.errors import AuthenticationError

__all__ = ["KEYS_UNAVAILABLE", "MAX_SET_BYTES", "JwksKeys"]

log = logging.getLogger(__name__)

KEYS_UNAVAILABLE = "cannot verify the token: signing keys unavailable"
MAX_SET_BYTES = 1024 * 1024  # a larger answer is not a key set


class JwksKeys:
    """The signing keys of one JWKS URL, by ``kid``."""

    def __init__(self, settings: JwtSettings) -> None:
        assert settings.jwks_url is not None
        self._url, self._timeout = settings.jwks_url, settings.jwks_timeout_seconds
        self._ssl: ssl.SSLContext | bool = True if settings.jwks_ca_file is None else ssl.create_default_context(
            cafile=str(settings.jwks_ca_file))
        self._lifespan, self._min_refresh = settings.jwks_cache_seconds, settings.jwks_min_refresh_seconds
        self._keys: PyJWKSet | None = None
        self._fetched_at = self._failed_at = -float("inf")  # the last fetch that succeeded, that failed
        self._fetch: asyncio.Task[PyJWKSet | None] | None = None

    async def key(self, kid: object) -> PyJWK:
        """The key named ``kid``; ``AuthenticationError`` when there is none or the set cannot be had."""
        if not isinstance(kid, str) or not kid:
            raise AuthenticationError("invalid token")  # a key of a set is chosen by its kid
        if self._keys is not None and _since(self._fetched_at) <= self._lifespan:
            key = _find(self._keys, kid)
            if key is not None or _since(self._fetched_at) < self._min_refresh:
                return _found(key, kid)  # within the cooldown a kid the set lacks is refused without a fetch
        if self._fetch is None and _since(self._failed_at) < self._min_refresh:
            raise AuthenticationError(KEYS_UNAVAILABLE)
        if self._fetch is None:
            self._fetch = asyncio.create_task(self._fetched(), name="toolbooth-jwks")
        # Shielded: a call that ends (its deadline) leaves the fetch to the others waiting for it.
        keys = await asyncio.shield(self._fetch)
        if keys is None:
            raise AuthenticationError(KEYS_UNAVAILABLE)
        return _found(_find(keys, kid), kid)

    async def _fetched(self) -> PyJWKSet | None:
        """Fetch the set and keep it; ``None`` (logged) when it cannot be had."""
        try:
            data = json.loads(await self._download())
            if not isinstance(data, dict):
                raise ValueError("the answer is not a JSON object")
            self._keys, self._fetched_at = PyJWKSet.from_dict(data), time.monotonic()
            return self._keys
        except (OSError, aiohttp.ClientError, ValueError, jwt.PyJWTError) as exc:
            self._failed_at = time.monotonic()
            reason = f"no whole answer within {self._timeout:g} s" if isinstance(exc, TimeoutError) else exc
            log.warning("cannot fetch the JWKS %s (tried again in %g s at the earliest): %s", self._url,
                        self._min_refresh, reason)
            return None
        finally:
            self._fetch = None

    async def _download(self) -> bytes:
        """The body of a ``200`` answer to GET ``jwks_url``, all of it within ``jwks_timeout_seconds``."""
        answer = await download(self._url, timeout=self._timeout, max_bytes=MAX_SET_BYTES, tls=self._ssl,
                                redirects=False)
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}")
        return answer.body


def _since(moment: float) -> float:
    return time.monotonic() - moment


def _find(keys: PyJWKSet, kid: str) -> PyJWK | None:
    """As ``PyJWKClient`` chooses: by ``kid``, among the keys for signatures."""
    return next((key for key in keys.keys if key.key_id == kid and key.public_key_use in ("sig", None)), None)


def _found(key: PyJWK | None, kid: str) -> PyJWK:
    if key is None:
        log.debug("token rejected: no key %r in the JWKS", kid)
        raise AuthenticationError("invalid token")
    return key
