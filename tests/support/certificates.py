"""Test PKI made with ``cryptography``: a CA, and server and client certificates it signs, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Authority", "Issued"]


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Write ``name.crt`` and ``name.key`` in ``directory``; their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        return cert, key

    @property
    def serial(self) -> int:
        return x509.load_pem_x509_certificate(self.cert_pem).serial_number


class Authority:
    """A self-signed CA that issues leaf certificates."""

    def __init__(self, name: str = "Toolbooth Test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._name = subject
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self._key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.pem)
        return path

    def issue(self, common_name: str, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
              client: bool = False) -> Issued:
        """A leaf certificate for ``hosts`` (DNS names or IP addresses): a server's, or a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self._name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), key_pem)
