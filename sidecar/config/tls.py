"""``server.tls``: TLS on the TCP addresses of ``server.listen`` (Unix sockets stay plaintext).

``cert_file`` and ``key_file`` are the server's certificate (chain) and private key in PEM;
``client_ca_file``, when set, turns on mutual TLS: a client must present a certificate that CA signed.
Every file must exist at start; the server reads them again when they change
(``sidecar.server.tls``), so a rotated certificate needs no restart.
"""

from __future__ import annotations

from pydantic import FilePath

from sidecar.config.base import Section

__all__ = ["ServerTlsSettings"]


class ServerTlsSettings(Section):
    """The server's certificate and key, and the CA its clients' certificates must chain to (mTLS)."""

    cert_file: FilePath
    key_file: FilePath
    client_ca_file: FilePath | None = None

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return self.client_ca_file is not None
