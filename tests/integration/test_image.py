"""The image, built with buildah from the Dockerfile as it is, and run with podman as ``deploy/kubernetes`` runs it.

No Docker daemon and no registry: the builder's base (``PYTHON_IMAGE``) is the Debian 12 image that
``bash .ci/image-tools`` makes with debootstrap, with what the Dockerfile installs on ``debian:bookworm-slim``, and
the runtime's root is made of its packages in the build (no shell in it); the script also installs buildah, podman
and runc and writes the ``containers.conf`` they run with. The build's ``pip``
reaches PyPI trusting what this machine trusts (``tests/support/image_build.py``, which
``benchmarks/bench_image.py`` builds with too). The image is the session's (``tests/conftest.py``: built once,
removed at the end); each test runs containers of it and removes them.

The sidecar runs with ``deploy/kubernetes/config.yaml``'s configuration (a Unix socket on a shared volume, the
health-only port, RS256 JWTs verified with a mounted public key, the policies mounted), as uid 10001 on a
read-only root with no capability and ``no-new-privileges``, the socket and state directories as volumes, a
tmpfs ``/tmp``; the agent is a second container of the same image, another uid in the socket's group.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import jwt
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.utils import canonicalize_name

from tests.support.build_context import pinned_versions
from tests.support.image_build import ENGINE_ENV, TARGET_IMAGE_BYTES, engine, python
from tests.support.signing_keys import key_pair
from tests.support.waiting import until_blocking

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # builds the image first (~40 s)

REPO = Path(__file__).resolve().parents[2]
# 183.5 MB measured: the virtualenv 112.6 MB (bytecode of start-up's imports only) and the root made of Debian's
# packages (Python, its libraries, libstdc++, CA certificates); 333 MB on python:3.11-slim with pip before. The test
# fails past issue 27's target, TARGET_IMAGE_BYTES (200 MB).
SIDECAR_UID, AGENT_UID = 10001, 10002
HARDENED = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
LISTING = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"


def _inspect(image: str) -> dict[str, object]:
    document: list[dict[str, object]] = json.loads(engine("podman", "image", "inspect", image).stdout)
    return document[0]


def test_the_image_is_small_non_root_and_has_a_healthcheck(image: str, capsys: pytest.CaptureFixture[str]) -> None:
    inspected = _inspect(image)
    config = inspected["Config"]
    assert isinstance(config, dict)
    assert config["User"] == f"{SIDECAR_UID}:{SIDECAR_UID}"
    assert config["Entrypoint"] == ["tini", "--", "toolbooth", "serve"]
    assert set(config["Volumes"]) == {"/var/lib/toolbooth", "/run/toolbooth"}
    healthcheck = inspected["Healthcheck"]
    assert isinstance(healthcheck, dict) and healthcheck["Test"][0] == "CMD"
    size = inspected["Size"]
    assert isinstance(size, int)
    with capsys.disabled():
        print(f"\ntoolbooth image: {size / 1e6:.1f} MB; target <= {TARGET_IMAGE_BYTES / 1e6:.0f} MB")
    assert size <= TARGET_IMAGE_BYTES


def test_the_runtime_has_no_shell_and_no_package_manager(image: str) -> None:
    found = python(image, "import os, shutil; print([name for name in ('sh', 'bash', 'dash', 'apt-get', 'dpkg', "
                          "'pip', 'pip3', 'ls', 'cat') if shutil.which(name)], os.path.exists('/var/lib/dpkg/status'))",
                   "--read-only")
    assert found.split() == ["[]", "False"], found


def test_the_runtime_verifies_tls_and_has_its_locale(image: str) -> None:
    # OpenSSL's default paths lead to the CA bundle (a JWKS URL, an OPA server, SMTP over TLS verify against it), and
    # the C.UTF-8 locale that LANG names exists (setlocale raises if not).
    found = python(image, "import locale, ssl; locale.setlocale(locale.LC_ALL, ''); "
                          "print(len(ssl.create_default_context().get_ca_certs()))", "--read-only")
    assert int(found) > 100, found


def test_the_image_installs_exactly_the_pinned_versions(image: str) -> None:
    installed = {canonicalize_name(name): version for name, version in json.loads(python(image, LISTING)).items()}
    pins = pinned_versions(REPO)
    assert {name: installed.get(name) for name in pins} == pins
    assert {name for name in set(installed) - set(pins) if not name.startswith("toolbooth")} == set(), "not pinned"


class Sidecar:
    """``toolbooth serve`` in a container, attached (its exit status is ``podman run``'s); the socket and state
    directories are host directories, as a pod's ``emptyDir``s are."""

    def __init__(self, image: str, root: Path, public_key: str) -> None:
        self.image, self.name = image, f"toolbooth-test-{uuid.uuid4().hex[:12]}"
        self.socket_dir, state, etc = root / "socket", root / "state", root / "etc"
        for directory in (self.socket_dir, state):
            directory.mkdir(mode=0o750)
            os.chown(directory, SIDECAR_UID, SIDECAR_UID)
        (etc / "jwt").mkdir(parents=True)
        (etc / "jwt" / "jwt.pub").write_text(public_key)
        configmap = yaml.safe_load((REPO / "deploy" / "kubernetes" / "config.yaml").read_text())
        (etc / "toolbooth.yaml").write_text(configmap["data"]["toolbooth.yaml"])
        for path in (etc, etc / "jwt", etc / "jwt" / "jwt.pub", etc / "toolbooth.yaml"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        self.log = (root / "sidecar.log").open("w")
        self.process = subprocess.Popen(
            ["podman", "run", "--name", self.name, "--network", "none", *HARDENED,
             "--user", f"{SIDECAR_UID}:{SIDECAR_UID}", "--tmpfs", "/tmp",
             "--volume", f"{self.socket_dir}:/run/toolbooth", "--volume", f"{state}:/var/lib/toolbooth",
             "--volume", f"{etc / 'toolbooth.yaml'}:/etc/toolbooth/config/toolbooth.yaml:ro",
             "--volume", f"{REPO / 'policies' / 'toolbooth'}:/etc/toolbooth/policies:ro",
             "--volume", f"{etc / 'jwt'}:/etc/toolbooth/jwt:ro",
             image, "--config", "/etc/toolbooth/config/toolbooth.yaml"],
            env=ENGINE_ENV, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return (self.socket_dir.parent / "sidecar.log").read_text()

    def serving(self) -> bool:
        """Whether gRPC health over the socket says ``SERVING``; raises once the container has exited."""
        if self.process.poll() is not None:
            raise AssertionError(f"the sidecar exited with {self.process.returncode}:\n{self.output()[-3000:]}")
        socket = self.socket_dir / "toolbooth.sock"
        if not socket.exists():
            return False
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def agent(self, *command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """``toolbooth COMMAND`` in a second container, another uid in the socket's group (a pod's fsGroup)."""
        variables = [f"--env={name}={value}" for name, value in env.items()]
        return subprocess.run(
            ["podman", "run", "--rm", "--network", "none", *HARDENED, "--user", f"{AGENT_UID}:{AGENT_UID}",
             "--group-add", str(SIDECAR_UID), "--volume", f"{self.socket_dir}:/run/toolbooth", *variables,
             "--env", "TOOLBOOTH_TARGET=unix:///run/toolbooth/toolbooth.sock", "--entrypoint", "toolbooth",
             self.image, *command],
            env=ENGINE_ENV, capture_output=True, text=True, timeout=120, check=False)

    def stop(self) -> int:
        """``podman stop`` (SIGTERM, the image's STOPSIGNAL); the container's exit status."""
        engine("podman", "stop", "--time", "30", self.name)
        return self.process.wait(timeout=60)

    def remove(self) -> None:
        subprocess.run(["podman", "rm", "--force", self.name], env=ENGINE_ENV, capture_output=True, check=False)
        self.process.wait(timeout=60)
        self.log.close()


@pytest.fixture
def sidecar(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar container, serving."""
    running = Sidecar(image, tmp_path_factory.mktemp("c"), key_pair("RS256").public)
    try:
        started = time.monotonic()
        until_blocking(running.serving, timeout=60, what="gRPC health SERVING over the socket")
        print(f"SERVING {time.monotonic() - started:.1f} s after podman run")
        yield running
    finally:
        running.remove()


def test_the_image_healthcheck_reports_healthy(sidecar: Sidecar) -> None:
    engine("podman", "healthcheck", "run", sidecar.name)  # exit 1: unhealthy
    state = json.loads(engine("podman", "inspect", "--format", "{{json .State.Health}}", sidecar.name).stdout)
    assert state["Status"] == "healthy" and state["Log"][-1]["ExitCode"] == 0


def test_an_agent_container_calls_a_tool_over_the_socket_with_a_token(sidecar: Sidecar) -> None:
    claims = {"sub": "alice", "iss": "https://issuer.example", "aud": "toolbooth", "tenant": "acme",
              "roles": ["developer"], "exp": int(time.time()) + 600}
    token = jwt.encode(claims, key_pair("RS256").private, algorithm="RS256")
    arguments = json.dumps({"operation": "add", "operands": [2, 3]})
    called = sidecar.agent("call", "calculate", "--args", arguments, env={"TOOLBOOTH_TOKEN": token})
    assert called.returncode == 0, called.stdout + called.stderr
    result = json.loads(called.stdout)
    assert (result["status"], result["data"]["result"]) == ("success", 5.0)
    refused = sidecar.agent("call", "calculate", "--args", arguments, env={})
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stdout + refused.stderr


def test_sigterm_stops_it_cleanly(sidecar: Sidecar) -> None:
    assert sidecar.stop() == 0, sidecar.output()[-3000:]
    assert not (sidecar.socket_dir / "toolbooth.sock").exists()
