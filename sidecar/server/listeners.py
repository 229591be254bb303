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
"""

from __future__ import annotations

import errno
import socket
import stat
from collections.abc import Iterable
from pathlib import Path

import grpc

from sidecar.config import ListenAddress, ListenKind, parse_listen

__all__ = ["bind_all", "remove_sockets", "reserve_port", "tcp_socket"]


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


def tcp_socket(text: str, host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound (not listening) to the first address of ``host`` (unbracketed) that binds, as gRPC
    binds (``SO_REUSEADDR``, and ``SO_REUSEPORT`` with ``reuse_port``); ``OSError`` ``cannot listen on TEXT:
    <reason>`` when none does."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {text}: the host {host!r} does not resolve ({exc.strerror})") from None
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
    raise OSError(f"cannot listen on {text}: {_reason(problems[0]) if problems else 'the host has no address'}")


def _reason(exc: OSError) -> str:
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
