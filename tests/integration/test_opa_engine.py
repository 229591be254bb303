"""What only the opa engine does: uploading policies, using OPA-managed ones, token, TLS, start-up errors.

Tests that need a server behaviour the test itself sets up (a token, TLS, activated
bundles) use the local server alone; the others use the same server as
``test_policy_engines.py`` (the local one, or it in front of ``$TOOLBOOTH_TEST_OPA_URL``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import ssl
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.config import PolicyEngineKind, PolicySettings, bundled_policy_dir
from sidecar.errors import PolicyLoadError
from sidecar.policy import PolicyEngine, Stage
from sidecar.policy.embedded import EmbeddedEngine
from sidecar.policy.engines import open_engine
from sidecar.policy.factory import open_reloading
from sidecar.policy.input import PolicyInput
from tests.support.opa_server import OpaServer
from tests.support.reloading import rewrite

pytestmark = pytest.mark.integration

INPUT = PolicyInput.of({
    "principal": {"id": "u1", "tenant": "acme", "roles": ["developer"], "permissions": []},
    "tool": {"name": "admin_console", "version": "1.0.0", "side_effect": "none", "permissions": [], "plugin": "t"},
    "context": {"stage": "availability", "time": "2026-11-30T15:00:00Z", "conversation_id": None},
})

Open = Callable[..., Any]


@pytest.fixture
def opa() -> Iterator[OpaServer]:
    with OpaServer(upstream=os.environ.get("TOOLBOOTH_TEST_OPA_URL")) as server:
        yield server


@pytest.fixture
def local() -> Iterator[OpaServer]:
    """The local server alone, even when another OPA server is configured."""
    with OpaServer() as server:
        yield server


@pytest.fixture
async def open_opa() -> AsyncIterator[Open]:
    """``await open_opa(url, path=None, **opa_settings)``: an opa engine, closed at teardown."""
    opened: list[PolicyEngine] = []

    async def open_(url: str, path: Path | None = None, **opa_settings: Any) -> PolicyEngine:
        engine = await open_engine(PolicySettings.model_validate({
            "engine": PolicyEngineKind.OPA, "path": path or bundled_policy_dir(), "opa": {"url": url, **opa_settings},
        }))
        opened.append(engine)
        return engine

    yield open_
    for engine in opened:
        await engine.aclose()


def served_policy_ids(opa: OpaServer) -> list[str]:
    with urllib.request.urlopen(f"{opa.url}/v1/policies", timeout=5) as response:
        return sorted(p["id"] for p in json.load(response)["result"] if p["id"].startswith("toolbooth/"))


async def test_upload_replaces_the_policies_it_uploaded_before(open_opa: Open, opa: OpaServer, tmp_path: Path,
                                                               bundled_policies: Path) -> None:
    path = Path(shutil.copytree(bundled_policies, tmp_path / "policies"))
    (path / "lib").mkdir()
    (path / "lib" / "extra.rego").write_text("package toolbooth.extra\n\nlimit := 3\n")
    await open_opa(opa.url, path)
    assert "toolbooth/lib/extra.rego" in served_policy_ids(opa)
    engine = await open_opa(opa.url, bundled_policies)
    assert served_policy_ids(opa) == ["toolbooth/approval.rego", "toolbooth/authz.rego", "toolbooth/availability.rego"]
    assert engine.revision == EmbeddedEngine.load(bundled_policies).revision


async def test_policies_managed_by_opa_are_used_as_served(open_opa: Open, opa: OpaServer) -> None:
    uploader = await open_opa(opa.url)
    writes = len([seen for seen in opa.seen if seen.method in ("PUT", "DELETE")])
    engine = await open_opa(opa.url, upload_policies=False)
    assert await engine.decide(Stage.AVAILABILITY, INPUT) == await uploader.decide(Stage.AVAILABILITY, INPUT)
    assert len([seen for seen in opa.seen if seen.method in ("PUT", "DELETE")]) == writes
    assert engine.revision == f"opa:{opa.url}"


async def test_revision_of_managed_policies_is_the_bundles(open_opa: Open, local: OpaServer) -> None:
    bundles = {"main": {"manifest": {"revision": "r-42", "roots": ["toolbooth"]}}, "extra": {"manifest": {}}}
    put = urllib.request.Request(f"{local.url}/v1/data/system/bundles", data=json.dumps(bundles).encode(), method="PUT")
    urllib.request.urlopen(put, timeout=5).close()
    engine = await open_opa(local.url, upload_policies=False)
    assert engine.revision == "opa-bundles:extra@,main@r-42"


async def test_unreachable_opa_stops_an_upload_but_not_a_managed_start(open_opa: Open) -> None:
    with OpaServer() as gone:
        url = gone.url
    with pytest.raises(PolicyLoadError, match=f"cannot upload policies to OPA at {url}"):
        await open_opa(url)
    assert (await open_opa(url, upload_policies=False)).revision == f"opa:{url}"


async def test_opa_compile_errors_name_the_file_and_place(open_opa: Open, opa: OpaServer, tmp_path: Path) -> None:
    path = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    (path / "approval.rego").write_text("package toolbooth.approval\n\ndecision := {\"required\": \n")
    where = re.escape(f"cannot load {path / 'approval.rego'}: OPA refused it: invalid_parameter: ")
    with pytest.raises(PolicyLoadError, match=rf"{where}.*; \d+:\d+: \w"):
        await open_opa(opa.url, path)


async def test_data_must_be_an_object_of_objects(open_opa: Open, opa: OpaServer, tmp_path: Path) -> None:
    path = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    (path / "data.json").write_text('{"limit": 3}')
    with pytest.raises(PolicyLoadError, match=r"data\.json: to upload it to OPA"):
        await open_opa(opa.url, path)


async def test_decisions_ask_for_strict_builtin_errors(open_opa: Open, opa: OpaServer) -> None:
    await (await open_opa(opa.url)).decide(Stage.AVAILABILITY, INPUT)
    assert opa.seen[-1].path == "/v1/data/toolbooth/availability/decision?strict-builtin-errors=true"


async def test_bearer_token_is_sent(open_opa: Open) -> None:
    with OpaServer(token="s3cret") as guarded:
        with pytest.raises(PolicyLoadError, match="401"):
            await open_opa(guarded.url)
        engine = await open_opa(guarded.url, token="s3cret")
        assert (await engine.decide(Stage.AVAILABILITY, INPUT)).allow is False
    assert {seen.authorization for seen in guarded.seen[1:]} == {"Bearer s3cret"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    root = tmp_path_factory.mktemp("pki")
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("test CA", ca_key, ca_key)
    loopback = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    return {
        "ca": _pem(root / "ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
        "server": _pem(root / "server.pem", _certificate("server", server_key, ca_key, ca, loopback)
                       .public_bytes(serialization.Encoding.PEM)),
        "server_key": _pem(root / "server.key", _private(server_key)),
        "client": _pem(root / "client.pem", _certificate("client", client_key, ca_key, ca)
                       .public_bytes(serialization.Encoding.PEM)),
        "client_key": _pem(root / "client.key", _private(client_key)),
    }


def _certificate(name: str, key: ec.EllipticCurvePrivateKey, issuer_key: ec.EllipticCurvePrivateKey,
                 issuer: x509.Certificate | None = None, *extensions: x509.ExtensionType) -> x509.Certificate:
    """Self-signed CA when ``issuer`` is ``None``, else a leaf it signs; valid for an hour."""
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer.subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))
    if issuer is None:
        usage = {name: False for name in ("digital_signature", "content_commitment", "key_encipherment",
                                          "data_encipherment", "key_agreement", "encipher_only", "decipher_only")}
        builder = builder.add_extension(x509.KeyUsage(key_cert_sign=True, crl_sign=True, **usage), critical=True)
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _private(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(file: Path, content: bytes) -> Path:
    file.write_bytes(content)
    return file


def server_tls(pki: dict[str, Path], *, client_certificates: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server"], pki["server_key"])
    if client_certificates:
        context.load_verify_locations(pki["ca"])
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def test_tls_verifies_the_server_against_the_ca_file(open_opa: Open, pki: dict[str, Path]) -> None:
    with OpaServer(tls=server_tls(pki, client_certificates=False)) as secure:
        with pytest.raises(PolicyLoadError, match="certificate verify failed"):
            await open_opa(secure.url)
        engine = await open_opa(secure.url, tls={"ca_file": str(pki["ca"])})
        assert (await engine.decide(Stage.AVAILABILITY, INPUT)).allow is False


async def test_tls_presents_the_client_certificate(open_opa: Open, pki: dict[str, Path]) -> None:
    with OpaServer(tls=server_tls(pki, client_certificates=True)) as secure:
        with pytest.raises(PolicyLoadError, match="cannot upload"):
            await open_opa(secure.url, tls={"ca_file": str(pki["ca"])})
        engine = await open_opa(secure.url, tls={"ca_file": str(pki["ca"]), "cert_file": str(pki["client"]),
                                                 "key_file": str(pki["client_key"])})
        assert (await engine.decide(Stage.AVAILABILITY, INPUT)).allow is False


async def test_an_unusable_client_certificate_names_the_key(open_opa: Open, pki: dict[str, Path]) -> None:
    with pytest.raises(PolicyLoadError, match=r"policy\.opa\.tls\.cert_file: cannot load the client certificate"):
        await open_opa("https://127.0.0.1:1", tls={"cert_file": str(pki["ca"]), "key_file": str(pki["server_key"])})


@pytest.mark.parametrize("breakage", ["tests fail", "does not compile"])
async def test_a_refused_reload_never_reaches_opa(opa: OpaServer, tmp_path: Path, breakage: str) -> None:
    path = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    settings = PolicySettings.model_validate({"engine": "opa", "path": str(path), "reload_requires_tests": True,
                                              "opa": {"url": opa.url, "timeout_seconds": 5}})
    reloader = await open_reloading(settings)
    try:
        before = served_authz(opa)
        if breakage == "tests fail":
            rewrite(path / "authz.rego", before.replace("missing permission(s)", "lacking"))
        else:
            rewrite(path / "authz.rego", 'package toolbooth.authz\n\nimport rego.v1\n\ndecision := {"allow": x}\n')
        status = await reloader.reload_if_changed()
        assert not status.healthy and served_authz(opa) == before
    finally:
        await reloader.aclose()


def served_authz(opa: OpaServer) -> str:
    with urllib.request.urlopen(f"{opa.url}/v1/policies", timeout=5) as response:
        return next(str(p["raw"]) for p in json.load(response)["result"] if p["id"] == "toolbooth/authz.rego")


async def test_audit_masks_are_read_from_opa(open_opa: Open, opa: OpaServer, tmp_path: Path) -> None:
    path = Path(shutil.copytree(bundled_policy_dir(), tmp_path / "policies"))
    data = json.loads((path / "data.json").read_text())
    data["toolbooth"]["audit"] = {"mask": {"send_email": ["/body"]}}
    (path / "data.json").write_text(json.dumps(data))
    assert await (await open_opa(opa.url, path)).audit_masks() == {"send_email": ("/body",)}
    assert await (await open_opa(opa.url)).audit_masks() == {}
