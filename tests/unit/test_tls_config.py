"""``server.tls`` and ``server.health_listen`` as configured: what is refused at start, and how it is said."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.config import load_settings, parse_settings
from sidecar.errors import ConfigError
from sidecar.server.tls import CertificateFiles, server_credentials
from tests.support.certificates import Authority


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return Authority().issue("toolbooth").write(tmp_path, "server")


def _settings(tls: dict[str, Any], **server: Any) -> Any:
    return parse_settings({"server": {"listen": ["127.0.0.1:0"], "tls": tls, **server}}).server.tls


def _refusal(tls: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        CertificateFiles(_settings(tls))
    return str(caught.value)


def test_no_tls_is_plaintext() -> None:
    assert server_credentials(None) is None


def test_a_usable_pair_gives_credentials(pair: tuple[Path, Path], tmp_path: Path) -> None:
    cert, key = pair
    ca = Authority().write(tmp_path / "clients.crt")
    files = CertificateFiles(_settings({"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(ca)}))
    assert files.summary.startswith("CN=toolbooth, expires ")
    assert files.fetch() is None  # nothing changed since start
    assert server_credentials(_settings({"cert_file": str(cert), "key_file": str(key)})) is not None


def test_a_key_of_another_certificate_is_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    cert, _ = pair
    _, other_key = Authority().issue("other").write(tmp_path / "other", "server")
    assert _refusal({"cert_file": str(cert), "key_file": str(other_key)}) == (
        f"config error at server.tls.key_file: {other_key} is not the key of the certificate in {cert}")


def test_files_that_are_not_pem_are_refused_by_name(pair: tuple[Path, Path], tmp_path: Path) -> None:
    cert, key = pair
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert _refusal({"cert_file": str(junk), "key_file": str(key)}) == (
        f"config error at server.tls.cert_file: {junk} holds no PEM certificate")
    assert _refusal({"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(junk)}) == (
        f"config error at server.tls.client_ca_file: {junk} holds no PEM certificate")
    assert _refusal({"cert_file": str(cert), "key_file": str(junk)}).startswith(
        f"config error at server.tls.key_file: {junk} is not an unencrypted PEM private key")


def test_missing_files_and_misplaced_tls_are_config_errors(pair: tuple[Path, Path], tmp_path: Path) -> None:
    cert, key = pair
    with pytest.raises(ConfigError) as missing:
        _settings({"cert_file": str(cert), "key_file": str(tmp_path / "missing.key")})
    assert str(missing.value) == (f"config error at server.tls.key_file: Path does not point to a file "
                                  f"({tmp_path / 'missing.key'})")
    with pytest.raises(ConfigError) as caught:
        parse_settings({"server": {"listen": ["unix:/tmp/tb.sock"], "tls": {"cert_file": str(cert),
                                                                           "key_file": str(key)}}})
    assert str(caught.value) == ("config error at server: 'tls' is set but no address in 'listen' is TCP: TLS applies "
                                 "to TCP addresses only (Unix sockets stay plaintext)")


def test_the_health_listener_is_tcp_and_may_leave_loopback_in_dev_mode() -> None:
    server = parse_settings({"server": {"health_listen": "0.0.0.0:8081"}}).server
    assert server.health_listen == "0.0.0.0:8081"
    with pytest.raises(ConfigError) as caught:
        parse_settings({"server": {"health_listen": "unix:/tmp/health.sock"}})
    assert str(caught.value) == ("config error at server.health_listen: 'unix:/tmp/health.sock': the health-only "
                                 "listener is for probes over TCP: HOST:PORT or [IPV6]:PORT")


def test_the_health_listener_from_the_environment_names_the_variable() -> None:
    env = {"TOOLBOOTH_SERVER__HEALTH_LISTEN": "0.0.0.0:8081"}
    assert load_settings(None, env).server.health_listen == "0.0.0.0:8081"
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"TOOLBOOTH_SERVER__HEALTH_LISTEN": "localhost"})
    assert str(caught.value).startswith(
        "config error at server.health_listen (from TOOLBOOTH_SERVER__HEALTH_LISTEN): 'localhost': expected")


def test_the_client_tls_variables_are_not_sidecar_settings(tmp_path: Path) -> None:
    env = {"TOOLBOOTH_TLS": "1", "TOOLBOOTH_TLS_CA": str(tmp_path / "ca.crt"), "TOOLBOOTH_TLS_CERT": "c",
           "TOOLBOOTH_TLS_KEY": "k", "TOOLBOOTH_TLS_SERVER_NAME": "toolbooth"}
    assert load_settings(None, env).server.tls is None
