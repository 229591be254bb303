"""TLS on the TCP listeners (``server.tls``), through ``sidecar.client`` and the ``toolbooth`` command.

A CA, a server and a client certificate are made for each test (``tests/support/certificates.py``). The
server serves TLS on 127.0.0.1:0 and plaintext on its Unix socket; a rotated certificate is served to the
connections made after it, without a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from sidecar.cli import main
from sidecar.client import AsyncClient, ClientError, ClientTls
from sidecar.config import Settings
from sidecar.server import Sidecar
from tests.integration.conftest import StartSidecar
from tests.integration.test_server import FakeGateway
from tests.support.certificates import Authority
from tests.support.kube_volume import project

pytestmark = pytest.mark.integration


@pytest.fixture
def ca() -> Authority:
    return Authority()


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    return tmp_path / "tls"


def _tls(ca: Authority, tls_dir: Path, *, mutual: bool = False) -> dict[str, Any]:
    cert, key = ca.issue("toolbooth").write(tls_dir, "server")
    section: dict[str, Any] = {"cert_file": str(cert), "key_file": str(key)}
    if mutual:
        section["client_ca_file"] = str(ca.write(tls_dir / "clients-ca.crt"))
    return {"tls": section}


def _tcp(sidecar: Sidecar) -> str:
    return next(address for address in sidecar.addresses if address.startswith("127.0.0.1:"))


async def _list(target: str, tls: ClientTls | None) -> str:
    async with AsyncClient(target, tls=tls, timeout=5) as client:
        return (await client.list_tools()).policy_revision


async def _refusal(target: str, tls: ClientTls | None) -> ClientError:
    with pytest.raises(ClientError) as caught:
        await _list(target, tls)
    return caught.value


def _served_serial(address: str, ca_file: Path) -> int:
    """The serial number of the certificate the server presents to a new connection."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca_file))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_client_trusting_the_ca_calls_over_tls_and_the_unix_socket_stays_plaintext(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path) -> None:
    sidecar = await start_sidecar(make_settings(server=_tls(ca, tls_dir)), FakeGateway())
    assert await _list(_tcp(sidecar), ClientTls(ca_file=ca.write(tls_dir / "ca.crt"))) == "rev-1"
    assert await _list(sidecar.addresses[0], None) == "rev-1"  # unix://...: plaintext


async def test_a_client_that_does_not_trust_the_ca_is_refused_with_what_to_do(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sidecar = await start_sidecar(make_settings(server=_tls(ca, tls_dir)), FakeGateway())
    refused = await _refusal(_tcp(sidecar), ClientTls())  # the system's CAs only
    assert refused.code is grpc.StatusCode.UNAVAILABLE and "CERTIFICATE_VERIFY_FAILED" in refused.details
    code = await asyncio.to_thread(main, ["tools", "list", "--target", _tcp(sidecar), "--tls"])
    assert code == 1
    assert "toolbooth: error: the sidecar's certificate is not trusted: give the CA that signed it with --tls-ca FILE" \
        in capsys.readouterr().err


async def test_a_client_trusts_the_system_bundle_openssl_finds(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Without --tls-ca the client trusts the system's CAs, as OpenSSL finds them (here SSL_CERT_FILE, as a pod's
    # mounted trust bundle or the image's own bundle): not only the roots gRPC ships.
    sidecar = await start_sidecar(make_settings(server=_tls(ca, tls_dir)), FakeGateway())
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.write(tls_dir / "system-bundle.crt")))
    assert await _list(_tcp(sidecar), ClientTls()) == "rev-1"


def test_a_system_bundle_that_cannot_be_read_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssl, "get_default_verify_paths", lambda: ssl.DefaultVerifyPaths(
        str(tmp_path), None, "SSL_CERT_FILE", str(tmp_path), "SSL_CERT_DIR", str(tmp_path)))  # a directory
    with pytest.raises(ValueError, match=f"^cannot read the TLS system CA bundle file {tmp_path}: Is a directory$"):
        ClientTls().credentials()


async def test_the_command_calls_over_tls_with_the_ca_from_the_environment(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    sidecar = await start_sidecar(make_settings(server=_tls(ca, tls_dir)), FakeGateway())
    monkeypatch.setenv("TOOLBOOTH_TLS_CA", str(ca.write(tls_dir / "ca.crt")))
    monkeypatch.setenv("TOOLBOOTH_TARGET", _tcp(sidecar))
    code = await asyncio.to_thread(main, ["tools", "list", "--output", "json"])
    captured = capsys.readouterr()
    assert code == 0 and "toolbooth: error" not in captured.err
    assert json.loads(captured.out)["policy_revision"] == "rev-1"


async def test_a_plaintext_client_of_a_tls_listener_is_told_to_use_tls(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sidecar = await start_sidecar(make_settings(server=_tls(ca, tls_dir)), FakeGateway())
    assert (await _refusal(_tcp(sidecar), None)).code is grpc.StatusCode.UNAVAILABLE
    assert await asyncio.to_thread(main, ["tools", "list", "--target", _tcp(sidecar)]) == 1
    assert "connect with --tls and --tls-ca FILE" in capsys.readouterr().err


async def test_a_tls_client_of_a_plaintext_listener_is_told_to_leave_tls_out(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sidecar = await start_sidecar(make_settings(), FakeGateway())
    ca_file = ca.write(tls_dir / "ca.crt")
    assert (await _refusal(_tcp(sidecar), ClientTls(ca_file=ca_file))).code is grpc.StatusCode.UNAVAILABLE
    assert await asyncio.to_thread(main, ["tools", "list", "--target", _tcp(sidecar), "--tls-ca", str(ca_file)]) == 1
    assert "the sidecar does not serve TLS at this address: leave out --tls" in capsys.readouterr().err


async def test_mutual_tls_refuses_a_client_without_a_certificate_or_with_one_of_another_ca(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tls_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sidecar = await start_sidecar(make_settings(server=_tls(ca, tls_dir, mutual=True)), FakeGateway())
    ca_file = ca.write(tls_dir / "ca.crt")
    refused = await _refusal(_tcp(sidecar), ClientTls(ca_file=ca_file))
    assert refused.code is grpc.StatusCode.UNAVAILABLE
    code = await asyncio.to_thread(main, ["tools", "list", "--target", _tcp(sidecar), "--tls-ca", str(ca_file)])
    assert code == 1
    assert "give --tls-cert FILE and --tls-key FILE" in capsys.readouterr().err
    stranger_cert, stranger_key = Authority("Another CA").issue("agent", client=True).write(tls_dir, "stranger")
    stranger = ClientTls(ca_file=ca_file, cert_file=stranger_cert, key_file=stranger_key)
    assert (await _refusal(_tcp(sidecar), stranger)).code is grpc.StatusCode.UNAVAILABLE
    agent_cert, agent_key = ca.issue("agent", client=True).write(tls_dir, "agent")
    assert await _list(_tcp(sidecar), ClientTls(ca_file=ca_file, cert_file=agent_cert, key_file=agent_key)) == "rev-1"


async def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The files are a Kubernetes Secret volume (``..data`` swapped); the new certificate is of a new CA."""
    old_ca, new_ca = Authority("Old CA"), Authority("New CA")
    volume = tmp_path / "secret"
    first = old_ca.issue("toolbooth")
    project(volume, {"tls.crt": first.cert_pem, "tls.key": first.key_pem})
    tls = {"cert_file": str(volume / "tls.crt"), "key_file": str(volume / "tls.key")}
    settings = make_settings(server={"tls": tls})
    sidecar = await start_sidecar(settings, FakeGateway())
    old_file, new_file = old_ca.write(tmp_path / "old.crt"), new_ca.write(tmp_path / "new.crt")
    async with AsyncClient(_tcp(sidecar), tls=ClientTls(ca_file=old_file), timeout=5) as before:
        await before.list_tools()
        assert await asyncio.to_thread(_served_serial, _tcp(sidecar), old_file) == first.serial

        second = new_ca.issue("toolbooth")
        with caplog.at_level(logging.INFO, logger="sidecar.server.tls"):
            project(volume, {"tls.crt": second.cert_pem, "tls.key": second.key_pem})
            assert await asyncio.to_thread(_served_serial, _tcp(sidecar), new_file) == second.serial
        assert "TLS certificate reloaded: CN=toolbooth" in caplog.text
        assert await _list(_tcp(sidecar), ClientTls(ca_file=new_file)) == "rev-1"
        assert (await _refusal(_tcp(sidecar), ClientTls(ca_file=old_file))).code is grpc.StatusCode.UNAVAILABLE
        await before.list_tools()  # a connection made before the rotation goes on


async def test_a_key_that_does_not_match_its_certificate_keeps_the_old_pair_serving(
        make_settings: Callable[..., Settings], start_sidecar: StartSidecar, ca: Authority, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    first, second = ca.issue("toolbooth"), ca.issue("toolbooth")
    cert, key = first.write(tmp_path, "server")
    sidecar = await start_sidecar(make_settings(server={"tls": {"cert_file": str(cert), "key_file": str(key)}}),
                                  FakeGateway())
    ca_file = ca.write(tmp_path / "ca.crt")
    with caplog.at_level(logging.WARNING, logger="sidecar.server.tls"):
        key.write_bytes(second.key_pem)  # the new key is written before its certificate
        for _ in range(3):
            assert await asyncio.to_thread(_served_serial, _tcp(sidecar), ca_file) == first.serial
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "sidecar.server.tls" and r.levelno >= logging.WARNING]
    assert warnings == [f"TLS certificate change not used, the previous certificate keeps serving: config error at "
                        f"server.tls.key_file: {key} is not the key of the certificate in {cert}"]
    cert.write_bytes(second.cert_pem)
    assert await asyncio.to_thread(_served_serial, _tcp(sidecar), ca_file) == second.serial


def test_tls_towards_a_unix_socket_or_with_a_missing_file_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "list", "--target", f"unix://{tmp_path}/tb.sock", "--tls"]) == 2
    assert capsys.readouterr().err == (f"toolbooth: error: unix://{tmp_path}/tb.sock: TLS is for TCP targets; "
                                       "a sidecar's Unix socket is plaintext\n")
    assert main(["tools", "list", "--target", "127.0.0.1:1", "--tls-ca", str(tmp_path / "none.crt")]) == 2
    assert capsys.readouterr().err == (f"toolbooth: error: cannot read the TLS CA file {tmp_path}/none.crt: "
                                       "No such file or directory\n")
    assert main(["tools", "list", "--target", "127.0.0.1:1", "--tls-cert", str(tmp_path / "c.crt")]) == 2
    assert capsys.readouterr().err == ("toolbooth: error: --tls-cert and --tls-key: a client certificate needs both "
                                       "its certificate and its key file (mutual TLS)\n")

