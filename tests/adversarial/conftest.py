"""The adversarial tests use the fixtures of ``tests/integration``: real sidecars on real sockets."""

from tests.integration.conftest import (  # noqa: F401 - fixtures
    jwt_auth,
    make_settings,
    make_token,
    rsa_key,
    serve_in_background,
    socket_path,
    start_sidecar,
)
