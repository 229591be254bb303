"""The image's runtime (``FROM scratch``: Debian 12's Python packages and nothing else) attacked from outside.

Each test runs what works in a Debian-based Python image and failed in the first root made of bare packages,
or what PID 1 must do:
the containers run as Kubernetes and Docker run them (no passwd entry is added for the image's uid, as podman
would add one by default: ``--passwd=false``), uid 10001, read-only root, no capability, no network. The image is
the session's (``tests/conftest.py``: built once, removed at the end).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.certificates import Authority
from tests.support.image_build import ENGINE_ENV, python
from tests.support.waiting import until_blocking

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # builds the image first

HARDENED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--passwd=false",
            "--user", "10001:10001", "--tmpfs", "/tmp"]
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # the system's CA bundle, as a pod's mounted trust bundle replaces it


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=ENGINE_ENV, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _trusting_the_ca(image: str, script: str, tls_files: Path) -> str:
    """``python -c script`` in a hardened container with ``tls_files`` at ``/tls`` and their CA as the system's
    bundle (a pod's mounted trust bundle)."""
    return python(image, script, *HARDENED, "--volume", f"{tls_files}:/tls:ro",
                  "--volume", f"{tls_files / 'ca.pem'}:{BUNDLE}:ro")


@pytest.fixture
def tls_files(tmp_path: Path) -> Path:
    """A CA (``ca.pem``, the bundle to mount) and a certificate for localhost it signed (``server.crt``/``.key``),
    readable by the container's uid."""
    authority = Authority()
    authority.write(tmp_path / "ca.pem")
    authority.issue("localhost").write(tmp_path, "server")
    for path in (tmp_path, *tmp_path.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return tmp_path


def test_libpq_and_getpass_know_the_image_user(image: str) -> None:
    # A DSN without a user (host=db dbname=app, PGUSER unset) makes libpq ask getpwuid() for the OS user name; the
    # root's passwd has root and nobody only, so it fails before connecting ("local user with ID 10001 does not
    # exist") where the Debian-based image, whose uid 10001 was `toolbooth`, tried that role.
    output = python(image, "import getpass, psycopg\n"
                            "try:\n    print('user', getpass.getuser())\nexcept KeyError as e:\n    print(e)\n"
                            "try:\n    psycopg.connect('host=127.0.0.1 port=9 dbname=app connect_timeout=2')\n"
                            "except psycopg.OperationalError as e:\n    print(e)\n", *HARDENED)
    assert "uid not found" not in output and "local user" not in output, output


def test_postgres_sslrootcert_system_uses_the_image_ca_bundle(image: str, tls_files: Path) -> None:
    # sslmode=verify-full sslrootcert=system (how managed PostgreSQL services with public CAs are reached) makes
    # psycopg's own OpenSSL (psycopg_binary.libs, OPENSSLDIR /usr/lib/psycopg-openssl) load its default paths,
    # which are not in the image: the server is refused even though the system bundle trusts its CA.
    script = (
        "import socket, ssl, struct, threading, psycopg\n"
        "context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
        "context.load_cert_chain('/tls/server.crt', '/tls/server.key')\n"
        "listener = socket.create_server(('127.0.0.1', 0))\n"
        "def serve():\n"
        "    connection, _ = listener.accept()\n"
        "    connection.recv(8)\n"  # SSLRequest
        "    connection.sendall(b'S')\n"
        "    tls = context.wrap_socket(connection, server_side=True)\n"
        "    tls.recv(4096)\n"  # the startup message
        "    body = b'SFATAL\\0C28000\\0Mreached over TLS\\0\\0'\n"
        "    tls.sendall(b'E' + struct.pack('>I', len(body) + 4) + body)\n"
        "    tls.close()\n"
        "threading.Thread(target=serve, daemon=True).start()\n"
        "port = listener.getsockname()[1]\n"
        "try:\n"
        "    psycopg.connect(f'host=localhost port={port} dbname=x user=u sslmode=verify-full sslrootcert=system '\n"
        "                    'gssencmode=disable connect_timeout=5')\n"
        "except psycopg.OperationalError as e:\n"
        "    print(e)\n")
    assert "reached over TLS" in (output := _trusting_the_ca(image, script, tls_files)), output


def test_client_tls_trusts_the_system_bundle(image: str, tls_files: Path) -> None:
    # `toolbooth ... --tls` is documented as trusting the system's CAs (sidecar.client_tls.ClientTls()); gRPC
    # verifies with the roots.pem inside the grpcio wheel instead, so a CA the image's bundle holds is not trusted.
    script = (
        "import grpc\n"
        "from concurrent import futures\n"
        "from grpc_health.v1 import health, health_pb2, health_pb2_grpc\n"
        "from sidecar.client_tls import ClientTls, open_channel\n"
        "server = grpc.server(futures.ThreadPoolExecutor(2))\n"
        "health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)\n"
        "credentials = grpc.ssl_server_credentials([(open('/tls/server.key', 'rb').read(),\n"
        "                                            open('/tls/server.crt', 'rb').read())])\n"
        "port = server.add_secure_port('127.0.0.1:0', credentials)\n"
        "server.start()\n"
        "with open_channel(f'localhost:{port}', ClientTls()) as channel:\n"
        "    try:\n"
        "        print(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10))\n"
        "    except grpc.RpcError as e:\n"
        "        print('refused', e.details())\n"
        "server.stop(None)\n")
    assert "SERVING" in (output := _trusting_the_ca(image, script, tls_files)), output


def _start(image: str) -> str:
    """``toolbooth serve`` (dev mode, the default socket), detached; its container's name."""
    name = f"toolbooth-test-{uuid.uuid4().hex[:12]}"
    done = _podman("run", "-d", "--name", name, "--network", "none", *HARDENED, image)
    assert done.returncode == 0, done.stderr
    return name


def test_sigterm_while_the_sidecar_starts_stops_it(image: str) -> None:
    # PID 1 ignores a signal it has no handler for: a SIGTERM that comes while the modules load (a pod deleted
    # as it starts) is lost, and the sidecar then serves until the runtime's SIGKILL.
    name = _start(image)
    try:
        _podman("kill", "--signal", "TERM", name)
        try:
            _podman("wait", name, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the sidecar did not stop within 20 s of a SIGTERM sent while it started")
    finally:
        _podman("rm", "--force", "--volumes", name)


def test_pid_1_reaps_orphaned_processes(image: str) -> None:
    # What `kubectl exec` starts and leaves behind is re-parented to PID 1: unless PID 1 waits for it, it stays a
    # zombie, holding a PID, until the container ends. The orphan is gone from /proc only once it was reaped.
    name = _start(image)
    try:
        until_blocking(lambda: _podman("healthcheck", "run", name).returncode == 0, timeout=60,
                       what="the HEALTHCHECK passing")
        started = _podman("exec", name, "python", "-c", "import subprocess; print(subprocess.Popen("
                          "['python', '-c', 'pass']).pid)")
        orphan = int(started.stdout)
        gone = f"import os; print(os.path.exists('/proc/{orphan}'))"
        until_blocking(lambda: _podman("exec", name, "python", "-c", gone).stdout.strip() == "False", timeout=30,
                       what=f"the orphan {orphan} reaped")
    finally:
        _podman("rm", "--force", "--volumes", name)
