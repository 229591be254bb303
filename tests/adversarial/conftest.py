"""The adversarial tests use the fixtures of ``tests/integration``: real sidecars on real sockets."""

from __future__ import annotations

from tests.integration.conftest import (
    jwt_auth,
    make_settings,
    make_token,
    rsa_key,
    serve_in_background,
    socket_path,
    start_sidecar,
)

__all__ = ["jwt_auth", "make_settings", "make_token", "rsa_key", "serve_in_background", "socket_path",
           "start_sidecar"]
