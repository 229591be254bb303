"""TLS of the TCP listeners (``server.tls``): credentials that pick up a rotated certificate without a restart.

gRPC's ``dynamic_ssl_server_credentials`` asks a fetcher for the certificate configuration at every new
connection's handshake. ``CertificateFiles.fetch`` answers from a stat of the files (cheap): unchanged, it
tells gRPC to keep what it has; changed (modification time, size or inode: a file rewritten or renamed
over, a Kubernetes Secret volume's ``..data`` swapped), it reads them again and hands gRPC the new
configuration, which the connections made from then on see (open ones keep theirs). A new set that
cannot be used — unreadable, not PEM, a key that does not match the certificate (the key written before
its certificate) — is logged once and the previous one keeps serving; the next handshake looks again.
At start the same faults are a ``ConfigError`` naming the file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import grpc

from sidecar.config import ServerTlsSettings
from sidecar.errors import ConfigError

if TYPE_CHECKING:  # cryptography loads only with server.tls
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

__all__ = ["CertificateFiles", "server_credentials"]

log = logging.getLogger(__name__)

Signature = tuple[tuple[int, int, int], ...]  # (inode, size, mtime) of each file


def server_credentials(settings: ServerTlsSettings | None) -> grpc.ServerCredentials | None:
    """The credentials of the TCP listeners: ``None`` (plaintext) without ``server.tls``; ``ConfigError`` when
    its files cannot be used."""
    if settings is None:
        return None
    files = CertificateFiles(settings)
    log.info("TLS on TCP listeners: %s%s", files.summary, ", client certificates required" if settings.mutual else "")
    return files.credentials()


@dataclass(frozen=True)
class _Loaded:
    configuration: grpc.ServerCertificateConfiguration
    summary: str  # for the log: the certificate's subject and when it expires


class CertificateFiles:
    """The certificate, key and client CA files of ``server.tls``, read again when they change."""

    def __init__(self, settings: ServerTlsSettings) -> None:
        self._settings = settings
        self._paths = tuple(p for p in (settings.cert_file, settings.key_file, settings.client_ca_file) if p)
        self._lock = threading.Lock()  # gRPC may call the fetcher from several threads
        self._signature = self._stat()
        self._refused: str | None = None  # the problem last logged
        self._initial = self._load()

    @property
    def summary(self) -> str:
        """The certificate served at start: its subject and when it expires."""
        return self._initial.summary

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that ask ``fetch`` at each handshake."""
        # The stubs say the fetcher returns a configuration; gRPC takes None as "keep the current one".
        fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], self.fetch)
        return grpc.dynamic_ssl_server_credentials(self._initial.configuration, fetcher,
                                                   require_client_authentication=self._settings.mutual)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new configuration when the files changed and can be used, else ``None``; never raises (gRPC
        would fail the handshake)."""
        with self._lock:
            try:
                signature = self._stat()
                if signature == self._signature:
                    return None
                loaded = self._load()
            except (ConfigError, OSError) as exc:  # a file missing or half written: the next handshake looks again
                self._refuse(str(exc))
                return None
            self._signature, self._refused = signature, None
        log.info("TLS certificate reloaded: %s", loaded.summary)
        return loaded.configuration

    def _refuse(self, problem: str) -> None:
        """Log a problem once, however many handshakes meet it."""
        if problem != self._refused:
            log.warning("TLS certificate change not used, the previous certificate keeps serving: %s", problem)
        self._refused = problem

    def _stat(self) -> Signature:
        stats = [os.stat(path) for path in self._paths]
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def _load(self) -> _Loaded:
        settings = self._settings
        chain_pem, key_pem = _read(settings.cert_file, "cert_file"), _read(settings.key_file, "key_file")
        chain = _certificates(chain_pem, "cert_file", settings.cert_file)
        from cryptography.hazmat.primitives import serialization

        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"config error at server.tls.key_file: {settings.key_file} is not an unencrypted "
                              f"PEM private key ({exc})") from None
        if _der(key.public_key()) != _der(chain[0].public_key()):
            raise ConfigError(f"config error at server.tls.key_file: {settings.key_file} is not the key of the "
                              f"certificate in {settings.cert_file}")
        roots = None
        if settings.client_ca_file is not None:
            roots = _read(settings.client_ca_file, "client_ca_file")
            _certificates(roots, "client_ca_file", settings.client_ca_file)
        configuration = grpc.ssl_server_certificate_configuration([(key_pem, chain_pem)], root_certificates=roots)
        leaf = chain[0]
        return _Loaded(configuration, f"{leaf.subject.rfc4514_string()}, expires {leaf.not_valid_after_utc:%Y-%m-%d}")


def _read(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config error at server.tls.{key}: cannot read {path}: {exc.strerror or exc}") from None


def _certificates(pem: bytes, key: str, path: Path) -> list[x509.Certificate]:
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        certificates = []
    if not certificates:
        raise ConfigError(f"config error at server.tls.{key}: {path} holds no PEM certificate")
    return certificates


def _der(key: PublicKeyTypes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
