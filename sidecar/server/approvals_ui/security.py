"""Security of every inbox response and request: strict headers, the expected ``Host``, bounded form bodies.

Every response gets a Content-Security-Policy that allows only the inbox's own script (``static/live.js``,
no inline script, no ``eval``), style sheet and connections back to it (the live updates), may not be
framed (``frame-ancestors 'none'``, ``X-Frame-Options: DENY``), sends no referrer,
is not sniffed and is not cached. On a loopback listener a request must name a loopback host (a page
that rebinds its own name to 127.0.0.1 cannot reach the inbox: ``sidecar.server.http_hosts``). A form body is read up to
``MAX_FORM_BYTES``, only as ``application/x-www-form-urlencoded`` and only as UTF-8 (percent-encoded bytes
that are not UTF-8 refuse the form; they are never replaced).
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qs

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.server.http_hosts import MISDIRECTED, misdirected

__all__ = ["HEADERS", "MAX_FORM_BYTES", "FormError", "Guarded", "read_form"]

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 64 * 1024
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; "
                               "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}


class FormError(Exception):
    """A form body that is too large or not URL-encoded; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Guarded:
    """ASGI: the security headers on every response; on loopback, requests for another host refused (421)."""

    def __init__(self, app: ASGIApp, *, loopback: bool) -> None:
        self._app, self._loopback = app, loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        if self._loopback and misdirected(Request(scope).headers.get("host")):
            response = PlainTextResponse(MISDIRECTED, status_code=421)
            await response(scope, receive, send_guarded)
            return
        await self._app(scope, receive, send_guarded)


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a URL-encoded form body (the first value of each), or ``FormError``."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise FormError(415, "a form must be sent as application/x-www-form-urlencoded")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise FormError(413, f"a form may hold at most {MAX_FORM_BYTES} bytes")
    except ClientDisconnect:  # gone before its form arrived (or cut off by the request deadline): read by no one
        log.debug("approval inbox: a client left before its form arrived")
        raise FormError(400, "the form did not arrive") from None
    try:  # the percent-encoded bytes too: never read as U+FFFD
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, errors="strict")
    except UnicodeDecodeError:
        raise FormError(400, "a form must be UTF-8, its percent-encoded bytes too; nothing changed") from None
    return {name: values[0] for name, values in fields.items()}

