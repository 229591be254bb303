"""``deploy/kubernetes`` and the Helm chart ``deploy/helm/toolbooth``: what a pod gets, as real Helm and kubectl
render it, checked offline.

``helm lint --strict`` passes and ``helm template`` renders the chart for each of its value variants (a Secret
or a JWKS, a ConfigMap or a bundle URL, metrics on or off, further config sections), and ``kubectl kustomize``
renders the plain manifests; both are the pinned official binaries ``.ci/helm-tools`` links into the
virtualenv (without them these tests are skipped, or fail under ``CI=true``). Every object rendered is
validated, strictly (an unknown field is an error), against the Kubernetes API's schemas of the lowest
release the chart's ``kubeVersion`` accepts (1.29, the first with native sidecars on by default) and of the
newest release ``kubernetes-validate`` ships. The pod is then checked for what the deployment promises:
Toolbooth as a native sidecar, its socket on an emptyDir both containers mount, gRPC probes on the health-only
port, policies from a ConfigMap, the JWT key from a Secret, a locked-down ``securityContext`` and resources
for every container; the chart's defaults render the same pod as the manifests. The ConfigMap's
``toolbooth.yaml`` is loaded by Toolbooth's own settings and start-up file checks, its paths moved under a
temporary directory holding what the volumes would; with it, ``toolbooth serve`` runs in a process of its
own, answers the probe on the health port and serves a token-bearing call on the socket.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jwt
import kubernetes_validate
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from sidecar.cli.preflight import check_files_named
from sidecar.client import Client
from sidecar.config import bundled_policy_dir, parse_listen, parse_settings, socket_path
from tests.support.required import missing
from tests.support.waiting import until_blocking

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
CHART = REPO / "deploy" / "helm" / "toolbooth"
TOOLS = Path(sysconfig.get_path("scripts"))  # where .ci/helm-tools links helm and kubectl
LOCKED_DOWN = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
               "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}

Doc = dict[str, Any]


def _kubernetes() -> tuple[str, str]:
    """The lowest release the chart's ``kubeVersion`` (``>=X.Y.Z-0``) accepts, the newest kubernetes-validate knows."""
    declared = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    lowest = re.fullmatch(r">=(\d+\.\d+\.\d+)-0", declared)
    assert lowest, f"Chart.yaml's kubeVersion {declared!r} is not >=X.Y.Z-0"
    return lowest[1], kubernetes_validate.latest_version()


KUBERNETES = _kubernetes()

SIGNER = {"algorithm": "RS256", "key": rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
          .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()}

EXTRA: Doc = {"extraConfig": {"limits": {"max_argument_bytes": 32768}, "logging": {"format": "json"}},
              "agent": {"command": [], "env": [{"name": "AGENT_MODE", "value": "test"}]}, "image": {"tag": "0.2.0"}}
CHART_VALUES: dict[str, Doc] = {
    "defaults": {},
    "a JWKS": {"auth": {"jwksUrl": "https://issuer.example/.well-known/jwks.json"}},
    "no metrics": {"metricsPort": 0},
    "a bundle URL": {"policies": {"bundleUrl": "https://bundles.example/toolbooth.tar.gz"}},
    "a signed bundle URL": {"policies": {"bundleUrl": "https://bundles.example/toolbooth.tar.gz",
                                         "bundleVerification": {"keys": {"signer": SIGNER}}}},
    "extra config": EXTRA,
}
VARIANTS = ["kubectl kustomize", *(f"chart: {name}" for name in CHART_VALUES)]


def _tool(name: str) -> str:
    path = TOOLS / name
    if not os.access(path, os.X_OK):
        missing(f"no {name} in {TOOLS}", install="bash .ci/helm-tools")
    return str(path)


def _run(*command: str, values: Doc | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, input=None if values is None else json.dumps(values), capture_output=True,
                          text=True, timeout=60)


def _helm(kubernetes: str, values: Doc, *command: str) -> subprocess.CompletedProcess[str]:
    """``helm COMMAND... CHART`` for Kubernetes ``kubernetes``, with ``values`` over values.yaml."""
    return _run(_tool("helm"), *command, str(CHART), "--kube-version", kubernetes, "--values", "-", values=values)


@functools.cache
def _rendered(variant: str, kubernetes: str) -> list[Doc]:
    if variant == "kubectl kustomize":
        done = _run(_tool("kubectl"), "kustomize", str(MANIFESTS))
    else:
        done = _helm(kubernetes, CHART_VALUES[variant.removeprefix("chart: ")], "template", "agent")
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _render(variant: str, kubernetes: str = KUBERNETES[-1]) -> list[Doc]:
    """The objects ``variant`` renders (a copy: each test may change its own)."""
    return copy.deepcopy(_rendered(variant, kubernetes))


def _one(docs: list[Doc], kind: str) -> Doc:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def _config(docs: list[Doc]) -> Doc:
    return yaml.safe_load(_one(docs, "ConfigMap")["data"]["toolbooth.yaml"])  # type: ignore[no-any-return]


def _pod(docs: list[Doc]) -> Doc:
    return _one(docs, "Deployment")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _mounts(container: Doc) -> dict[str, str]:
    return {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}


def _volume_of(pod: Doc, container: Doc, path: Path) -> Doc:
    """The volume ``container`` sees at ``path`` (the deepest mount holding it)."""
    holding = [mount for mount in _mounts(container) if path == Path(mount) or Path(mount) in path.parents]
    assert holding, f"{path} is on no volume of {container['name']}"
    name = _mounts(container)[max(holding, key=len)]
    return next(volume for volume in pod["volumes"] if volume["name"] == name)  # type: ignore[no-any-return]


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def docs(variant: str) -> list[Doc]:
    return _render(variant)


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_object_is_valid_against_the_kubernetes_schemas(variant: str, version: str) -> None:
    for doc in _render(variant, version):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} on Kubernetes {version}: "
                        f"{str(exc).splitlines()[0]} at {list(exc.path)}")


def test_toolbooth_is_a_native_sidecar_of_the_agent(docs: list[Doc]) -> None:
    pod = _pod(docs)
    (sidecar,) = pod["initContainers"]
    (agent,) = pod["containers"]
    assert (sidecar["name"], sidecar["restartPolicy"], agent["name"]) == ("toolbooth", "Always", "agent")
    assert sidecar["image"].split(":")[0] == "toolbooth" and "command" not in sidecar  # the image's toolbooth serve
    flag, config_file = sidecar["args"]
    assert flag == "--config"
    assert _volume_of(pod, sidecar, Path(config_file))["configMap"]["name"] == _one(docs, "ConfigMap")["metadata"][
        "name"]


def test_the_socket_is_on_an_emptydir_both_containers_mount_where_the_agent_looks(docs: list[Doc]) -> None:
    pod, config = _pod(docs), _config(docs)
    (sidecar,), (agent,) = pod["initContainers"], pod["containers"]
    (listen,) = config["server"]["listen"]
    path = socket_path(listen)
    assert path is not None
    volume = _volume_of(pod, sidecar, path)
    assert "emptyDir" in volume and _volume_of(pod, agent, path) == volume
    assert {env["name"]: env["value"] for env in agent["env"]}["TOOLBOOTH_TARGET"] == listen
    assert pod["securityContext"]["fsGroup"] == sidecar["securityContext"]["runAsGroup"]  # the socket's group


def test_the_probes_are_grpc_on_the_health_only_port(docs: list[Doc]) -> None:
    (sidecar,) = _pod(docs)["initContainers"]
    health = parse_listen(_config(docs)["server"]["health_listen"]).endpoints[0]
    assert health.host == "0.0.0.0"  # the kubelet probes the pod's IP
    probes = {name: sidecar[f"{name}Probe"] for name in ("startup", "readiness", "liveness")}
    assert all(probe["grpc"]["port"] == health.port for probe in probes.values())
    assert probes["readiness"]["grpc"]["service"] == "toolbooth.v1.ToolService"
    assert sidecar["ports"][0] == {"name": "health", "containerPort": health.port}
    assert {port["name"] for port in sidecar["ports"]} <= {"health", "metrics"}  # no port of the tool API


def test_metrics_are_on_their_own_port_with_the_annotations_prometheus_discovers(docs: list[Doc]) -> None:
    (sidecar,) = _pod(docs)["initContainers"]
    ports = {port["name"]: port["containerPort"] for port in sidecar["ports"]}
    annotations = _one(docs, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    listen = _config(docs).get("metrics", {}).get("listen")
    if listen is None:  # the chart's metricsPort: 0
        assert "metrics" not in ports and not any(name.startswith("prometheus.io/") for name in annotations)
        return
    metrics = parse_listen(listen).endpoints[0]
    assert (metrics.host, ports["metrics"]) == ("0.0.0.0", metrics.port)
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics.port),
                           "prometheus.io/path": "/metrics"}


def test_policies_come_from_a_configmap_or_a_bundle_url(docs: list[Doc]) -> None:
    pod, policy = _pod(docs), _config(docs)["policy"]
    (sidecar,) = pod["initContainers"]
    if "bundle" in policy:
        assert policy["bundle"]["url"].startswith("https://")
        assert "policies" not in {volume["name"] for volume in pod["volumes"]}
    else:
        assert "configMap" in _volume_of(pod, sidecar, Path(policy["path"]))


def test_the_jwt_key_comes_from_a_secret_or_the_issuers_jwks(docs: list[Doc]) -> None:
    pod, jwt = _pod(docs), _config(docs)["auth"]["jwt"]
    (sidecar,) = pod["initContainers"]
    if "jwks_url" in jwt:
        assert "key_file" not in jwt and not any("secret" in volume for volume in pod["volumes"])
    else:
        assert _volume_of(pod, sidecar, Path(jwt["key_file"]))["secret"]["secretName"] == "toolbooth-jwt"
    assert not [doc for doc in docs if doc["kind"] == "Secret"]  # no key is kept in the repository


def test_every_container_is_locked_down_and_bounded(docs: list[Doc]) -> None:
    pod = _pod(docs)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["initContainers"] + pod["containers"]:
        context = container["securityContext"]
        assert {key: context[key] for key in LOCKED_DOWN} == LOCKED_DOWN, container["name"]
        assert context["runAsUser"] >= 10000
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_what_toolbooth_writes_is_on_writable_volumes(docs: list[Doc]) -> None:
    pod, config = _pod(docs), _config(docs)
    (sidecar,) = pod["initContainers"]
    for path in (Path(config["store"]["sqlite_path"]), Path("/tmp/x")):
        assert "emptyDir" in _volume_of(pod, sidecar, path)
    read_only = {mount["name"] for mount in sidecar["volumeMounts"] if mount.get("readOnly")}
    assert {"config"} <= read_only and not read_only & {"socket", "state", "tmp"}


@pytest.fixture(scope="module")
def jwt_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def pod_root(jwt_key: rsa.RSAPrivateKey) -> Iterator[Path]:
    """What the sidecar's volumes would hold, under a short temporary directory (a socket path is at most
    107 bytes): the public key of ``jwt_key``, the bundled policies, empty state and socket directories."""
    root = Path(tempfile.mkdtemp(prefix="tb-pod-", dir="/tmp"))
    (root / "etc/toolbooth/jwt").mkdir(parents=True)
    (root / "etc/toolbooth/jwt/jwt.pub").write_bytes(jwt_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    shutil.copytree(bundled_policy_dir(), root / "etc/toolbooth/policies")
    for directory in ("var/lib/toolbooth", "run/toolbooth"):
        (root / directory).mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _moved(docs: list[Doc], root: Path) -> str:
    """The ConfigMap's toolbooth.yaml with the pod's paths under ``root``."""
    text = _one(docs, "ConfigMap")["data"]["toolbooth.yaml"]
    return re.sub(r"(?<=[\s\"'/])/(etc/toolbooth|var/lib/toolbooth|run/toolbooth)", f"{root}/\\1", text)


def test_the_configmap_is_a_configuration_toolbooth_starts_with(docs: list[Doc], pod_root: Path) -> None:
    settings = parse_settings(yaml.safe_load(_moved(docs, pod_root)))
    assert settings.auth.effective_mode.value == "jwt"  # never dev mode beside a real agent
    assert settings.server.health_listen is not None
    if settings.policy.bundle is None:
        check_files_named(settings)  # the key fits an allowed algorithm, the policy directory exists


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _health(address: str, service: str = "") -> int | None:
    with grpc.insecure_channel(address) as channel:
        try:
            return int(health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1).status)
        except grpc.RpcError:
            return None


def test_toolbooth_serve_runs_the_pods_configuration(pod_root: Path, jwt_key: rsa.RSAPrivateKey) -> None:
    """``toolbooth serve --config`` in a process of its own, as the container runs it (the probe port moved to
    loopback and a free port): the kubelet's probe is answered, the agent's call through the socket runs."""
    port = _free_port()
    config = pod_root / "toolbooth.yaml"
    metrics_port = _free_port()
    config.write_text(_moved(_render("kubectl kustomize"), pod_root).replace('"0.0.0.0:8081"', f'"127.0.0.1:{port}"')
                      .replace('"0.0.0.0:9464"', f'"127.0.0.1:{metrics_port}"'))
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
    env.update(PYTHONPATH=str(REPO), XDG_STATE_HOME=str(pod_root / "var/lib"), XDG_RUNTIME_DIR=str(pod_root / "run"))
    log = pod_root / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "sidecar", "serve", "--config", str(config)], cwd=pod_root,
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def probe_passes() -> bool:
            assert process.poll() is None, log.read_text()
            return _health(f"127.0.0.1:{port}", "toolbooth.v1.ToolService") == health_pb2.HealthCheckResponse.SERVING

        until_blocking(probe_passes, timeout=30, what="the readiness probe")
        token = jwt.encode({"sub": "alice", "iss": "https://issuer.example", "aud": "toolbooth", "tenant": "acme",
                            "roles": ["developer"], "exp": int(time.time()) + 300}, jwt_key, algorithm="RS256")
        with Client(f"unix://{pod_root}/run/toolbooth/toolbooth.sock", token=token, timeout=10) as client:
            result = client.execute("calculate", {"operation": "add", "operands": [2, 3]})
        assert result.status.value == "success", result
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ToolServiceStub(channel).ListTools(pb.ListToolsRequest(), timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as scraped:
            assert 'toolbooth_tool_calls_total{code="none",status="success",tool="calculate"} 1.0' in \
                scraped.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0, log.read_text()
    assert f"health only (for probes) on 127.0.0.1:{port}" in log.read_text()


# --- the plain manifests ---------------------------------------------------------------------------------------


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")


def test_kubectl_kustomize_renders_the_manifests_with_their_labels() -> None:
    docs = _render("kubectl kustomize")
    assert sorted(doc["kind"] for doc in docs) == ["ConfigMap", "Deployment"]
    assert all(doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "toolbooth" for doc in docs)


# --- the Helm chart ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("values", list(CHART_VALUES))
def test_helm_lint_strict_passes(values: str, version: str) -> None:
    done = _helm(version, CHART_VALUES[values], "lint", "--strict")
    assert done.returncode == 0, done.stdout + done.stderr


def _without_names(docs: list[Doc]) -> Iterator[Any]:
    """The chart's and the manifests' objects compared with names, labels and comments left out."""
    pod = _pod(docs)
    for volume in pod["volumes"]:
        volume.get("configMap", {}).pop("name", None)
    yield pod
    yield _config(docs)


def test_the_charts_defaults_render_the_same_pod_as_the_manifests() -> None:
    assert list(_without_names(_render("chart: defaults"))) == list(_without_names(_render("kubectl kustomize")))


def test_the_charts_further_config_and_agent_values_reach_the_pod() -> None:
    docs = _render("chart: extra config")
    config, (sidecar,), (agent,) = _config(docs), _pod(docs)["initContainers"], _pod(docs)["containers"]
    assert {key: config[key] for key in EXTRA["extraConfig"]} == EXTRA["extraConfig"]
    assert sidecar["image"] == "toolbooth:0.2.0" and "command" not in agent
    assert agent["env"][1:] == EXTRA["agent"]["env"]


@pytest.mark.parametrize("section", ["server", "metrics", "auth", "policy", "store"])
def test_the_chart_refuses_further_config_replacing_a_section_it_makes(section: str) -> None:
    done = _helm(KUBERNETES[-1], {"extraConfig": {section: {}, "limits": {}}}, "template", "agent")
    assert done.returncode != 0 and f"extraConfig cannot set {section}:" in done.stderr, done.stderr


@pytest.mark.parametrize(("values", "refusal"), [
    ({"metricPort": 0}, "additional properties 'metricPort' not allowed"),
    ({"auth": {"jwksURL": "https://issuer.example/jwks"}}, "additional properties 'jwksURL' not allowed"),
    ({"healthPort": 0}, "at '/healthPort'"),
    ({"policies": {"bundleUrl": "bundles.example/toolbooth.tar.gz"}}, "at '/policies/bundleUrl'"),
])
def test_the_charts_schema_refuses_unknown_or_malformed_values(values: Doc, refusal: str) -> None:
    done = _helm(KUBERNETES[-1], values, "template", "agent")
    assert done.returncode != 0 and refusal in done.stderr, done.stderr


def test_every_value_is_used_by_a_template() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = "".join(path.read_text() for path in (CHART / "templates").iterdir())
    unused = [key for key in values if f".Values.{key}" not in templates]
    assert unused == []


def test_the_chart_needs_kubernetes_with_native_sidecars() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["kubeVersion"] == ">=1.29.0-0"
    assert chart["appVersion"] == "0.1.0"  # the image tag by default
    refused = _helm("1.28.0", {}, "template", "agent")
    assert refused.returncode != 0 and "incompatible with Kubernetes v1.28.0" in refused.stderr, refused.stderr
