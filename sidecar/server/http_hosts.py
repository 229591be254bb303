"""The DNS-rebinding rule of the sidecar's loopback HTTP listeners: a request must name a loopback host.

A web page whose own name its attacker rebinds to 127.0.0.1 reaches a loopback listener through the
victim's browser, with that name in ``Host`` (and its origin in ``Origin``). On a loopback address the
approval inbox and the HTTP/JSON endpoint therefore answer only a ``Host`` naming a loopback host
(``misdirected``: ``421``); HTTP/JSON also refuses an ``Origin`` that is present and not a loopback origin
(``foreign_origin``: ``403``), the rule MCP's SDK applies there (``TransportSecuritySettings``). The inbox
checks no ``Origin``: its pages send no referrer, so a browser sends ``Origin: null`` with their own forms.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from sidecar.config import is_loopback

__all__ = ["FOREIGN_ORIGIN", "MISDIRECTED", "foreign_origin", "is_loopback_host", "misdirected"]

MISDIRECTED = "a loopback listener answers only to a loopback host name (Host)"
FOREIGN_ORIGIN = "a loopback listener answers only to pages of a loopback origin (Origin)"


def is_loopback_host(host: str) -> bool:
    """Whether a ``Host`` header (``name:port``, ``[v6]:port``) names a loopback host."""
    name = host.rpartition(":")[0] if not host.endswith("]") and ":" in host else host
    return bool(name) and is_loopback(name)


def misdirected(host: str | None) -> bool:
    """Whether a request to a loopback listener with ``host`` (its ``Host`` header) is refused."""
    return not is_loopback_host(host or "")


def foreign_origin(origin: str | None) -> bool:
    """Whether a request to a loopback listener with ``origin`` (its ``Origin`` header; absent from a client
    other than a browser) is refused: present and not ``http(s)://`` a loopback host."""
    if origin is None:
        return False
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - a port that is not a number is no origin
    except ValueError:
        return True
    return parts.scheme not in {"http", "https"} or not parts.hostname or not is_loopback(parts.hostname) \
        or parts.path not in {"", "/"} or bool(parts.query or parts.fragment or parts.username)
