"""Listen addresses in gRPC's naming (``unix:PATH``, ``unix:///ABS``, ``HOST:PORT``, ``dns:``, ``ipv4:``, ...).

``parse_listen`` reads one ``server.listen`` entry into a ``ListenAddress``: what it is (a Unix
socket file, an abstract socket, TCP), whether only this host can reach it, and the strings
``grpc.aio.Server.add_insecure_port`` binds. gRPC's server understands ``unix:``, ``unix-abstract:``
and ``HOST:PORT`` itself, not ``dns:``, ``ipv4:`` or ``ipv6:``: those are translated here, so every
form a gRPC client accepts as a target is also a listen address (with an explicit port; a
listener gets no default). ``socket_path`` finds the socket file of a client target.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

__all__ = ["LISTEN_FORMS", "MAX_PORT", "MAX_SOCKET_PATH_BYTES", "Endpoint", "ListenAddress", "ListenKind",
           "client_target", "is_loopback", "one_tcp_endpoint", "parse_listen", "socket_path"]

LISTEN_FORMS = ("unix:PATH, unix:///ABSOLUTE/PATH, unix-abstract:NAME, HOST:PORT, [IPV6]:PORT, "
                "dns:[///]HOST:PORT, ipv4:ADDRESS:PORT[,...] or ipv6:[ADDRESS]:PORT[,...]; PORT 1-65535, 0 for any")
MAX_PORT = 65535
MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes, the last one a NUL
_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}  # a listener's any address, a client's host
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*"
                        r"[A-Za-z0-9_])?)*\.?$")


class ListenKind(StrEnum):
    UNIX = "unix"  # a socket file
    ABSTRACT = "unix-abstract"  # Linux's abstract namespace: no file, no permissions
    TCP = "tcp"


@dataclass(frozen=True)
class Endpoint:
    """One TCP host and port (``host`` bracketed when it is an IPv6 address)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """Whether only this host can reach it."""
        return is_loopback(self.host)


@dataclass(frozen=True)
class ListenAddress:
    """One ``server.listen`` entry, as given (``text``) and as bound."""

    text: str
    kind: ListenKind
    path: Path | None = None  # UNIX: the socket file
    endpoints: tuple[Endpoint, ...] = ()  # TCP: one or more (``ipv4:a:1,b:2``)

    @property
    def is_local(self) -> bool:
        """Whether only this host can connect: a Unix socket, an abstract socket, or loopback TCP."""
        return self.kind is not ListenKind.TCP or all(endpoint.is_loopback for endpoint in self.endpoints)

    @property
    def binds(self) -> tuple[str, ...]:
        """What ``add_insecure_port`` is given, one string per socket."""
        if self.kind is ListenKind.TCP:
            return tuple(str(endpoint) for endpoint in self.endpoints)
        return (self.text,)


def parse_listen(text: str) -> ListenAddress:
    """The listen address ``text``; ``ValueError`` saying what is wrong and which forms exist."""
    scheme, _, rest = text.partition(":")
    if text.startswith("unix://"):
        path = text.removeprefix("unix://")
        if not path.startswith("/"):
            raise ValueError(f"{text!r}: a unix socket path must be absolute (unix:///path), or write unix:{path}")
        return ListenAddress(text, ListenKind.UNIX, path=_socket_file(text, path))
    if scheme == "unix":
        return ListenAddress(text, ListenKind.UNIX, path=_socket_file(text, rest))
    if scheme == "unix-abstract":
        if not rest or len(rest.encode()) > MAX_SOCKET_PATH_BYTES - 1:
            raise ValueError(f"{text!r}: an abstract socket needs a name of 1 to {MAX_SOCKET_PATH_BYTES - 1} bytes")
        return ListenAddress(text, ListenKind.ABSTRACT)
    if scheme == "vsock":
        raise ValueError(f"{text!r}: vsock addresses are not supported by this gRPC build")
    if scheme == "dns":
        if rest.startswith("//"):
            authority, _, rest = rest[2:].partition("/")
            if authority:
                raise ValueError(f"{text!r}: a DNS server ({authority}) means nothing to a listener; "
                                 "write dns:///HOST:PORT")
        return ListenAddress(text, ListenKind.TCP, endpoints=(_endpoint(text, rest),))
    if scheme in ("ipv4", "ipv6"):
        endpoints = tuple(_ip_endpoint(text, part, version=int(scheme[-1])) for part in rest.split(","))
        return ListenAddress(text, ListenKind.TCP, endpoints=endpoints)
    return ListenAddress(text, ListenKind.TCP, endpoints=(_endpoint(text, text),))


def one_tcp_endpoint(text: str, what: str) -> Endpoint:
    """The one TCP endpoint ``text`` names; ``ValueError`` if it is not one TCP address (``what`` listens there)."""
    address = parse_listen(text)
    if address.kind is not ListenKind.TCP or len(address.endpoints) != 1:
        raise ValueError(f"{text!r}: {what} listens on one TCP address, HOST:PORT or [IPV6]:PORT")
    return address.endpoints[0]


def client_target(listen: str) -> str:
    """The address a client on this host reaches the listen address ``listen`` at: a socket as it is, TCP as
    ``HOST:PORT`` of its first endpoint (any address, ``0.0.0.0`` or ``[::]``, becomes loopback); ``ValueError``
    for port 0, which no client can find."""
    address = parse_listen(listen)
    if address.kind is not ListenKind.TCP:
        return listen
    endpoint = address.endpoints[0]
    if endpoint.port == 0:
        raise ValueError(f"{listen!r} listens on any free port, which a client cannot know")
    return f"{_WILDCARDS.get(endpoint.host, endpoint.host)}:{endpoint.port}"


def socket_path(target: str) -> Path | None:
    """The socket file a client ``target`` names (``unix:PATH``, ``unix:///ABS``), else ``None``."""
    if target.startswith("unix://"):
        path = target.removeprefix("unix://")
        return Path(path) if path.startswith("/") else None
    if target.startswith("unix:"):
        return Path(target.removeprefix("unix:"))
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an IPv4 or a bracketed IPv6 address) is the loopback interface."""
    host = host.removeprefix("[").removesuffix("]")
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _socket_file(text: str, path: str) -> Path:
    if not path:
        raise ValueError(f"{text!r}: expected a socket path after 'unix:'")
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        raise ValueError(f"{text!r}: a unix socket path is at most {MAX_SOCKET_PATH_BYTES} bytes, "
                         f"this one has {len(path.encode())}")
    return Path(path)


def _split(text: str, address: str) -> tuple[str, str]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` into host (brackets kept) and port text."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port:
        raise ValueError(f"{text!r}: expected unix:///path or HOST:PORT (forms: {LISTEN_FORMS})")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:{port}")
    return host, port


def _port(text: str, port: str) -> int:
    if not port.isdigit() or not port.isascii():
        raise ValueError(f"{text!r}: the port {port!r} is not a number (1-65535, 0 for any free port)")
    number = int(port)
    if number > MAX_PORT:
        raise ValueError(f"{text!r}: the port {number} is out of range (1-65535, 0 for any free port)")
    return number


def _endpoint(text: str, address: str) -> Endpoint:
    host, port = _split(text, address)
    bare = host.removeprefix("[").removesuffix("]")
    if host.startswith("["):
        _ip(text, bare, version=6)
    elif not _is_ip(bare) and not _HOST_NAME.match(bare):
        raise ValueError(f"{text!r}: {host!r} is not a host name or IP address")
    return Endpoint(host, _port(text, port))


def _ip_endpoint(text: str, address: str, *, version: int) -> Endpoint:
    host, port = _split(text, address)
    _ip(text, host.removeprefix("[").removesuffix("]"), version=version)
    return Endpoint(host, _port(text, port))


def _ip(text: str, host: str, *, version: int) -> None:
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        parsed = None
    if parsed is None or parsed.version != version:
        raise ValueError(f"{text!r}: {host!r} is not an IPv{version} address")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
