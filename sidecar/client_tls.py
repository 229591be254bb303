"""The clients' channel to a sidecar: plaintext, or TLS when a ``ClientTls`` is given (``sidecar.client``).

A sidecar serves TLS on its TCP addresses when ``server.tls`` is set; its Unix sockets stay plaintext, so
TLS towards a ``unix:`` target is refused here. ``ClientTls()`` trusts the system's CAs (the bundle OpenSSL
finds: ``SSL_CERT_FILE``, else its default file; gRPC's own roots where there is none); ``ca_file`` trusts that CA
instead (a private one); ``cert_file`` and ``key_file`` present a client certificate (mutual TLS,
``server.tls.client_ca_file``); ``server_name`` is the name the server's certificate must carry when the
target does not say it (an IP address, say). The files are read when the channel opens.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["ClientTls", "open_aio_channel", "open_channel"]

_PLAINTEXT_SCHEMES = ("unix:", "unix-abstract:")
# The metadata a client receives (a sidecar's is its status and message): gRPC refuses what lies between its soft
# and hard limits (8 and 16 KiB) at random, so both are one limit here. What a client sends is the sidecar's to
# limit (auth.max_token_bytes).
_METADATA_BYTES = 16 * 1024
_OPTIONS = [("grpc.max_metadata_size", _METADATA_BYTES), ("grpc.absolute_max_metadata_size", _METADATA_BYTES)]


@dataclass(frozen=True)
class ClientTls:
    """How a client checks the sidecar's certificate and, for mutual TLS, which certificate it presents."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both its certificate and its key file (mutual TLS)")

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials; ``ValueError`` naming a file that cannot be read."""
        roots = _read(self.ca_file, "CA") if self.ca_file is not None else _system_roots()
        return grpc.ssl_channel_credentials(root_certificates=roots,
                                            private_key=_read(self.key_file, "key"),
                                            certificate_chain=_read(self.cert_file, "certificate"))

    def options(self) -> list[tuple[str, str]]:
        """Channel options: the name the server's certificate is checked against, when given."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def open_aio_channel(target: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """An asyncio channel to ``target``: plaintext without ``tls``."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=_OPTIONS)
    return grpc.aio.secure_channel(_tcp(target), tls.credentials(), options=[*_OPTIONS, *tls.options()])


def open_channel(target: str, tls: ClientTls | None) -> grpc.Channel:
    """A blocking channel to ``target``: plaintext without ``tls``."""
    if tls is None:
        return grpc.insecure_channel(target, options=_OPTIONS)
    return grpc.secure_channel(_tcp(target), tls.credentials(), options=[*_OPTIONS, *tls.options()])


def _tcp(target: str) -> str:
    if target.startswith(_PLAINTEXT_SCHEMES):
        raise ValueError(f"{target}: TLS is for TCP targets; a sidecar's Unix socket is plaintext")
    return target


def _system_roots() -> bytes | None:
    """The system's CA bundle as OpenSSL finds it, or ``None`` where there is none (gRPC then trusts its own roots,
    which a system's added CAs are not among)."""
    cafile = ssl.get_default_verify_paths().cafile
    return None if cafile is None else _read(Path(cafile), "system CA bundle")


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the TLS {what} file {path}: {exc.strerror or exc}") from None
