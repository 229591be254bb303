"""One HTTP GET whose whole exchange is bounded: connecting, TLS, the answer's headers and its body.

A per-read timeout (``urllib``'s) lets a server that drips its answer, a byte now and then, hold a
fetch for as long as it likes; here ``timeout`` bounds all of it and ``max_bytes`` the body, on the
event loop (no thread to outlive a shutdown: cancelling the caller ends the fetch). The JWKS and the
policy bundle are fetched this way.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar import __version__

if TYPE_CHECKING:  # aiohttp loads at the first download: a bundle URL or a JWKS is configured
    import aiohttp

__all__ = ["Download", "TooLargeError", "download", "failure"]


@dataclass(frozen=True)
class Download:
    """An answer: its status, its ``ETag`` header and its whole body."""

    status: int
    etag: str | None
    body: bytes


class TooLargeError(ValueError):
    """The answer's body is larger than the caller allows."""


async def download(url: str, *, timeout: float, max_bytes: int, headers: Mapping[str, str] | None = None,
                   tls: ssl.SSLContext | bool = True, redirects: bool = True) -> Download:
    """GET ``url``, the whole exchange within ``timeout`` seconds (``TimeoutError``) and a body of at most
    ``max_bytes`` (``TooLargeError``); proxies as the environment says. Any status is an answer."""
    import aiohttp

    sent = {"User-Agent": f"toolbooth/{__version__}", **(headers or {})}
    async with asyncio.timeout(timeout), aiohttp.ClientSession(headers=sent, trust_env=True) as http, \
            http.get(url, ssl=tls, allow_redirects=redirects) as response:
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > max_bytes:
                raise TooLargeError(f"an answer larger than {max_bytes} bytes")
        return Download(response.status, response.headers.get("ETag"), bytes(body))


def failure(exc: aiohttp.ClientError | OSError) -> str:
    """What went wrong with a download, for a person: ``cannot connect to HOST:PORT: Connection refused``, ``the
    certificate of HOST:PORT is not trusted: ...``."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorCertificateError):  # its errno is OpenSSL's, not the system's
        error = exc.certificate_error
        reason = getattr(error, "verify_message", None) or getattr(error, "reason", None) or error
        return f"the certificate of {exc.host}:{exc.port} is not trusted: {reason}"
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno:
        return f"cannot connect to {exc.host}:{exc.port}: {os.strerror(exc.os_error.errno)}"
    return str(exc) or type(exc).__name__
