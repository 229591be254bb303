"""Binding ``server.listen``: every form ``sidecar.config.listen`` reads, with errors a person can act on.

gRPC reports a failed bind as ``RuntimeError("Failed to bind to address ...")`` and logs its reason
to stderr. So a TCP address (unless its port is 0) is first tried with a plain socket, which
names the reason — the port in use, an address this host does not have, a name that does not
resolve, a port that needs privileges — before gRPC binds it. A Unix socket's directory is made
(0750), a stale socket file replaced, a live one or another file refused. Every failure is an
``OSError`` whose message starts ``cannot listen on ADDRESS:``. Given credentials (``server.tls``:
``sidecar.server.tls``), TCP addresses serve TLS; Unix and abstract sockets stay plaintext.

With ``server.workers`` above 1 the supervisor holds each TCP port (``reserve_port``: bound with
``SO_REUSEPORT``, never listening, so it takes no connection) and every worker binds it with
``reuse_port``: the kernel spreads new connections across the workers listening there.

A port that no socket listens on can still refuse a bind: a connection that has closed stays in TIME-WAIT
for a minute, and one without ``SO_REUSEADDR`` (a client's, whose local port happened to be this one) holds
the port against every bind meanwhile. So a bind that fails while the kernel shows nothing listening there
(``/proc/net/tcp``) is tried again until ``FREED_WITHIN`` seconds have passed, said once in the log, rather
than failing a restart with "the port is in use".
"""

from __future__ import annotations

import errno
import logging
import socket
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc

from sidecar.config import ListenAddress, ListenKind, parse_listen

__all__ = ["FREED_WITHIN", "bind_all", "listening", "remove_sockets", "reserve_port", "tcp_socket"]

log = logging.getLogger(__name__)

FREED_WITHIN = 65.0  # seconds a port no socket listens on is waited for: TIME-WAIT lasts 60 s on Linux
_RETRY_SECONDS = 0.2
_LISTEN_STATE = "0A"  # TCP_LISTEN, as /proc/net/tcp writes it


async def bind_all(server: grpc.aio.Server, addresses: Iterable[str], *, tls: grpc.ServerCredentials | None = None,
                   reuse_port: bool = False) -> tuple[tuple[str, ...], tuple[Path, ...]]:
    """Bind every address (TCP ones with ``tls`` when given); return them as bound (real ports for port 0) and
    the socket files made. On failure release what was bound and re-raise. With ``reuse_port`` (a worker's
    server, made with ``grpc.so_reuseport``) its TCP ports are shared: they are not tried alone first."""
    bound: list[str] = []
    sockets: list[Path] = []
    try:
        for text in addresses:
            bound += _bind(server, parse_listen(text), sockets, tls, try_first=not reuse_port)
    except BaseException:
        await server.stop(None)
        remove_sockets(sockets)
        raise
    return tuple(bound), tuple(sockets)


def remove_sockets(paths: Iterable[Path]) -> None:
    """Remove the socket files this server made."""
    for path in paths:
        path.unlink(missing_ok=True)


def _bind(server: grpc.aio.Server, address: ListenAddress, sockets: list[Path],
          tls: grpc.ServerCredentials | None, *, try_first: bool) -> list[str]:
    if address.kind is ListenKind.UNIX:
        assert address.path is not None
        _prepare_socket_path(address.text, address.path)
        sockets.append(address.path)
    if address.kind is not ListenKind.TCP:
        _add_port(server, address.text, address.text)
        return [address.text]
    bound = []
    for endpoint in address.endpoints:
        if endpoint.port != 0 and try_first:
            _try_tcp(address.text, endpoint.host.removeprefix("[").removesuffix("]"), endpoint.port)
        bound.append(f"{endpoint.host}:{_add_port(server, address.text, str(endpoint), tls)}")
    return bound


def _add_port(server: grpc.aio.Server, text: str, bind: str, tls: grpc.ServerCredentials | None = None) -> int:
    try:
        return server.add_insecure_port(bind) if tls is None else server.add_secure_port(bind, tls)
    except RuntimeError:
        raise OSError(f"cannot listen on {text}: gRPC could not bind {bind} "
                      "(GRPC_VERBOSITY=debug shows gRPC's reason)") from None


def _try_tcp(text: str, host: str, port: int) -> None:
    """Bind (not listen) a plain socket where gRPC will: one resolved address that binds is enough, as for gRPC."""
    tcp_socket(text, host, port).close()


def reserve_port(text: str, host: str, port: int) -> socket.socket:
    """``host``'s ``port`` (any free one for 0) held for worker processes: first bound alone, so a port another
    process listens on is refused (``OSError`` ``cannot listen on TEXT: <reason>``), then by a socket with
    ``SO_REUSEPORT`` that never listens (so takes no connection) but keeps the port while workers restart."""
    if port != 0:
        tcp_socket(text, host, port).close()
    return tcp_socket(text, host, port, reuse_port=True)


def tcp_socket(text: str, host: str, port: int, *, reuse_port: bool = False,
               freed_within: float = FREED_WITHIN) -> socket.socket:
    """A TCP socket bound (not listening) to the first address of ``host`` (unbracketed) that binds, as gRPC
    binds (``SO_REUSEADDR``, and ``SO_REUSEPORT`` with ``reuse_port``); ``OSError`` ``cannot listen on TEXT:
    <reason>`` when none does. A port in use that nothing listens on is tried again for ``freed_within`` seconds."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {text}: the host {host!r} does not resolve ({exc.strerror})") from None
    deadline, told = time.monotonic() + freed_within, False
    while isinstance(bound := _bind_first(infos, reuse_port), list):
        if port == 0 or time.monotonic() >= deadline or not _only_closing(bound, port):
            problem = _reason(bound[0], port) if bound else "the host has no address"
            raise OSError(f"cannot listen on {text}: {problem}")
        if not told:
            log.warning("%s: port %d is held by connections still closing (TIME-WAIT), not by a listener; waiting "
                        "up to %.0f s for it to be free", text, port, freed_within)
            told = True
        time.sleep(_RETRY_SECONDS)
    return bound


def _bind_first(infos: Sequence[tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]],
                reuse_port: bool) -> socket.socket | list[OSError]:
    """A socket bound to the first of ``infos`` that binds, or why each did not."""
    problems: list[OSError] = []
    for family, kind, proto, _, sockaddr in infos:
        bound = socket.socket(family, kind, proto)
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            bound.bind(sockaddr)
        except OSError as exc:
            bound.close()
            problems.append(exc)
        else:
            return bound
    return problems


def _only_closing(problems: list[OSError], port: int) -> bool:
    """Whether every bind failed for a port in use that no socket listens on (as far as the kernel says)."""
    return bool(problems) and all(p.errno == errno.EADDRINUSE for p in problems) and listening(port) is False


def listening(port: int) -> bool | None:
    """Whether a socket listens on TCP ``port`` (any address) in this network namespace; ``None`` where the
    kernel does not say (no ``/proc/net/tcp``: not Linux)."""
    known = None
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        try:
            rows = [line.split() for line in table.read_text().splitlines()[1:]]
        except OSError:
            continue
        known = False
        if any(len(row) > 3 and row[3] == _LISTEN_STATE and int(row[1].rsplit(":", 1)[1], 16) == port
               for row in rows):
            return True
    return known


def _reason(exc: OSError, port: int) -> str:
    if exc.errno == errno.EADDRINUSE and listening(port) is False:
        return "the port is in use, though nothing listens there (a socket bound there, or connections closing)"
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another process is listening there)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "this host has no such address"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return exc.strerror or str(exc)


def _prepare_socket_path(text: str, path: Path) -> None:
    """Create the parent directory (0750) and remove a stale socket; never a live one or another file."""
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"cannot listen on {text}: cannot create the directory {path.parent}: {exc.strerror}") from None
    if not path.is_symlink() and not path.exists():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise FileExistsError(f"cannot listen on {path}: it exists and is not a socket")
    if _is_live(path):
        raise OSError(f"cannot listen on {path}: another process is listening there")
    path.unlink()


def _is_live(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
