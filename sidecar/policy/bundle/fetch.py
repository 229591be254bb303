"""Bundles over HTTP(S): a conditional GET with ``If-None-Match``, as OPA's bundle downloader polls.

``BundleFetcher.fetch`` sends the ETag of the last bundle it received; ``304 Not Modified``
comes back as a result without content. ``timeout`` bounds the whole request, body included
(``sidecar.downloads``: a server that drips its answer is cut off like a silent one). Every
failure is a ``BundleFetchError`` naming the URL: an HTTP error status, an unreachable, silent
or dripping server, or a body over ``MAX_BUNDLE_BYTES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sidecar.downloads import TooLargeError, download, failure
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
        import aiohttp  # loads only with a bundle URL

        conditional = {"If-None-Match": self.etag} if self.etag else {}
        try:
            answer = await download(self.url, timeout=self._timeout, max_bytes=MAX_BUNDLE_BYTES,
                                    headers={**self._headers, **conditional})
        except TimeoutError:
            raise BundleFetchError(f"GET {self.url}: timed out: no whole answer within {self._timeout:g} s") from None
        except TooLargeError:
            raise BundleFetchError(f"GET {self.url}: the bundle is larger than {MAX_BUNDLE_BYTES} bytes") from None
        except (aiohttp.ClientError, OSError) as exc:  # refused, an unknown host, a connection reset
            raise BundleFetchError(f"GET {self.url}: {failure(exc)}") from None
        if answer.status == 304:
            return FetchResult(None, self.etag)
        if answer.status != 200:
            raise BundleFetchError(f"GET {self.url}: HTTP {answer.status} {HTTPStatus(answer.status).phrase}")
        self.etag = answer.etag
        return FetchResult(answer.body, answer.etag)
