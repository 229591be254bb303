"""Bundles over HTTP(S): a conditional GET with ``If-None-Match``, as OPA's bundle downloader polls.

``BundleFetcher.fetch`` sends the ETag of the last bundle it received; ``304 Not Modified``
comes back as a result without content. The request runs on a worker thread
(``urllib.request`` via ``asyncio.to_thread``); ``timeout`` bounds each blocking socket
operation. Every failure is a ``BundleFetchError`` naming the URL: an HTTP error status,
an unreachable or silent server, or a body over ``MAX_BUNDLE_BYTES``.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sidecar.errors import BundleFetchError
from sidecar.policy.bundle.archive import MAX_BUNDLE_BYTES

if TYPE_CHECKING:
    from sidecar.config import BundleSettings

__all__ = ["BundleFetcher", "FetchResult"]


@dataclass(frozen=True)
class FetchResult:
    """A new bundle's bytes and ETag, or (``content`` is ``None``) not modified since the last fetch."""

    content: bytes | None
    etag: str | None

    @property
    def modified(self) -> bool:
        """Whether the server sent a bundle (``200``) rather than ``304 Not Modified``."""
        return self.content is not None


class BundleFetcher:
    """Downloads one bundle URL. ``etag`` (sent as ``If-None-Match``) follows each bundle received;
    set it to ``None`` to force a full download."""

    def __init__(self, url: str, *, etag: str | None = None, timeout: float = 10.0,
                 headers: Mapping[str, str] | None = None) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"{url!r}: a bundle URL must be http:// or https://")
        self.url, self.etag, self._timeout, self._headers = url, etag, timeout, dict(headers or {})

    @classmethod
    def from_settings(cls, settings: BundleSettings) -> BundleFetcher:
        """A fetcher for ``policy.bundle.url`` with its timeout and headers."""
        if settings.url is None:
            raise ValueError("policy.bundle has no url")
        return cls(settings.url, timeout=settings.timeout_seconds, headers=settings.headers)

    async def fetch(self) -> FetchResult:
        """GET the bundle unless it is unchanged; ``BundleFetchError`` on any failure."""
        result = await asyncio.to_thread(self._get, self.etag)
        if result.modified:
            self.etag = result.etag
        return result

    def _get(self, etag: str | None) -> FetchResult:
        conditional = {"If-None-Match": etag} if etag else {}
        request = urllib.request.Request(self.url, headers={**self._headers, **conditional})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                content, new_etag = response.read(MAX_BUNDLE_BYTES + 1), response.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 304:
                return FetchResult(None, etag)
            raise BundleFetchError(f"GET {self.url}: HTTP {exc.code} {exc.reason}") from None
        except OSError as exc:  # URLError (refused, unknown host), TimeoutError, a connection reset
            raise BundleFetchError(f"GET {self.url}: {getattr(exc, 'reason', None) or exc}") from None
        if len(content) > MAX_BUNDLE_BYTES:
            raise BundleFetchError(f"GET {self.url}: the bundle is larger than {MAX_BUNDLE_BYTES} bytes")
        return FetchResult(content, new_etag)
