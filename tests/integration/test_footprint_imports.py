"""A feature that is off loads nothing of its own (issue 27's footprint): a real ``serve``, its imports seen.

``python -X importtime`` writes a line to stderr as each import ends; the sidecar serves, answers a call and is
stopped, and the modules it imported are read from those lines. With the defaults (dev auth, SQLite, in-process
Rego, the bundled plugins, metrics and traces off) none of the libraries of the features that are off may be among
them, nor the sidecar's own modules of other commands and of policy bundles; with RS256 JWT auth and metrics on,
their libraries are, so the lines are seen to show lazy imports too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc
from tests.support.cli import ADD_2_3, REPO, START_TIMEOUT, cli_env, stopped
from tests.support.signing_keys import key_pair
from tests.support.waiting import until_blocking

pytestmark = pytest.mark.integration

# The libraries of features that are off with the defaults, with what turns each on.
OFF_BY_DEFAULT = {
    "prometheus_client": "metrics.listen",
    "opentelemetry.sdk": "OTEL_TRACES_EXPORTER",
    "jwt": "auth.mode: jwt, policy bundle signatures",
    "cryptography": "jwt auth, server.tls, bundle signatures",
    "aiohttp": "a bundle URL, a JWKS, the metrics endpoint, the OPA engine",
    "psycopg": "store.postgres_dsn, the plugins' PostgreSQL backends",
    "mcp": "mcp.listen",
    "starlette": "mcp.listen, http_json.listen, approvals_ui.listen",
    "uvicorn": "mcp.listen, http_json.listen, approvals_ui.listen",
    "rich": "the CLI's tables and progress bars",
    # The sidecar's own: what other commands (``toolbooth serve`` imports only its own group) and bundles load.
    "sidecar.cli.approvals": "toolbooth previews, approve, deny",
    "sidecar.cli.policy": "toolbooth policy",
    "sidecar.cli.audit": "toolbooth audit",
    "sidecar.cli.tools": "toolbooth tools, call",
    "sidecar.policy.devtools": "toolbooth policy test and check, policy.reload_requires_tests",
    "sidecar.policy.bundle": "policy.bundle, toolbooth policy bundle",
}


def _serve_imports(home: Path, config: dict[str, Any], token: str | None = None) -> set[str]:
    """The modules a real ``serve`` of ``config`` imported by the time it was SERVING and had answered a call."""
    socket = home / "tb.sock"
    path = home / "toolbooth.json"
    path.write_text(json.dumps({"server": {"listen": [f"unix://{socket}"]},
                                "store": {"sqlite_path": str(home / "tb.db")}, "log_level": "WARNING", **config}))
    log = home / "imports.log"
    env = {name: value for name, value in cli_env(home).items() if not name.startswith("OTEL_")}
    with log.open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "sidecar", "serve", "--config",
                                    str(path)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            until_blocking(lambda: _serving(channel, process), timeout=START_TIMEOUT, what="SERVING")
            metadata = (("authorization", f"Bearer {token}"),) if token else ()
            reply = pb_grpc.ToolServiceStub(channel).ExecuteTool(
                pb.ExecuteToolRequest(tool="calculate", arguments_json=ADD_2_3), metadata=metadata, timeout=30)
            assert reply.status == pb.STATUS_SUCCESS, reply
    finally:
        assert stopped(process) == 0, log.read_text()[-2000:]
    lines = log.read_text().splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}


def _serving(channel: grpc.Channel, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "serve exited"
    request = health_pb2.HealthCheckRequest(service="toolbooth.v1.ToolService")
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=1.0)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _loaded(modules: set[str], library: str) -> bool:
    return any(module == library or module.startswith(f"{library}.") for module in modules)


def test_the_default_serve_loads_no_library_of_a_feature_that_is_off(home: Path) -> None:
    modules = _serve_imports(home, {"auth": {"mode": "dev"}})
    assert "sidecar.server.app" in modules and _loaded(modules, "toolbooth_documents")  # it served, with the plugins
    loaded = {library: why for library, why in OFF_BY_DEFAULT.items() if _loaded(modules, library)}
    assert loaded == {}, f"loaded with their features off (library: what needs it): {loaded}"


def test_jwt_auth_and_metrics_load_their_libraries(home: Path) -> None:
    jwt_settings = {"algorithms": ["RS256"], "issuer": "https://issuer.example", "audience": "toolbooth",
                    "key": key_pair("RS256").public}
    claims = {"sub": "alice", "iss": "https://issuer.example", "aud": "toolbooth", "exp": int(time.time()) + 300,
              "tenant": "acme", "roles": ["developer"]}
    token = jwt.encode(claims, key_pair("RS256").private, algorithm="RS256")
    modules = _serve_imports(home, {"auth": {"mode": "jwt", "jwt": jwt_settings},
                                    "metrics": {"listen": "127.0.0.1:0"}}, token)
    assert {"jwt", "cryptography", "prometheus_client"} <= modules
    assert not _loaded(modules, "opentelemetry.sdk") and not _loaded(modules, "psycopg")
