"""``auth.jwt.jwks_url`` as configured: what is refused at start, and the message a user sees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.config import load_settings, parse_settings
from sidecar.errors import ConfigError


def _jwt(**jwt: Any) -> dict[str, Any]:
    return {"auth": {"jwt": {"issuer": "https://issuer.example", "audience": "toolbooth", **jwt}}}


def _refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw)
    return str(caught.value)


def test_a_jwks_url_is_enough_and_listens_beyond_loopback() -> None:
    settings = parse_settings({**_jwt(jwks_url="https://issuer.example/.well-known/jwks.json"),
                               "server": {"listen": ["0.0.0.0:50051"]}})
    assert settings.auth.jwt is not None
    assert (settings.auth.jwt.jwks_cache_seconds, settings.auth.jwt.jwks_min_refresh_seconds) == (300.0, 30.0)


@pytest.mark.parametrize(("jwt", "message"), [
    ({"key": "k", "jwks_url": "https://i.example/jwks"},
     "config error at auth.jwt: exactly one of 'key', 'key_file' or 'jwks_url' must be set"),
    ({"jwks_url": "http://issuer.example/jwks"},
     "config error at auth.jwt.jwks_url: 'http://issuer.example/jwks': the keys that verify tokens are fetched over "
     "https:// (http:// only from a loopback host)"),
    ({"jwks_url": "file:///etc/jwks.json"},
     "config error at auth.jwt.jwks_url: 'file:///etc/jwks.json': expected https://HOST[:PORT]/PATH"),
    ({"jwks_url": "https://i.example/jwks", "algorithms": ["RS256", "HS256"]},
     "config error at auth.jwt: HS256: an HMAC secret is never published in a JWKS; verify HS* tokens with 'key' or "
     "'key_file'"),
    ({"key": "k", "jwks_ca_file": "/etc/hostname"}, "config error at auth.jwt: 'jwks_ca_file' needs 'jwks_url'"),
    ({"jwks_url": "https://i.example/jwks", "jwks_timeout_seconds": 0},
     "config error at auth.jwt.jwks_timeout_seconds: Input should be greater than 0"),
])
def test_bad_jwks_settings_are_refused_with_their_key(jwt: dict[str, Any], message: str) -> None:
    assert _refusal(_jwt(**jwt)) == message


def test_a_jwks_url_from_the_environment_names_the_variable() -> None:
    env = {"TOOLBOOTH_AUTH__JWT__ISSUER": "i", "TOOLBOOTH_AUTH__JWT__AUDIENCE": "a",
           "TOOLBOOTH_AUTH__JWT__JWKS_URL": "http://idp.example/jwks"}
    with pytest.raises(ConfigError) as caught:
        load_settings(None, env)
    assert str(caught.value).startswith("config error at auth.jwt.jwks_url (from TOOLBOOTH_AUTH__JWT__JWKS_URL): ")


def test_config_validate_shows_where_keys_come_from_and_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.certificates import Authority

    cert, key = Authority().issue("toolbooth").write(tmp_path, "server")
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"server:\n  listen: ['127.0.0.1:5001']\n  health_listen: 0.0.0.0:8081\n"
                      f"  tls: {{cert_file: {cert}, key_file: {key}}}\n"
                      f"auth:\n  jwt: {{issuer: i, audience: a, jwks_url: 'https://i.example/jwks'}}\n"
                      f"store:\n  sqlite_path: {tmp_path}/tb.db\n")
    assert main(["config", "validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "  listen:   127.0.0.1:5001 (TLS on TCP)\n" in out
    assert "  health:   0.0.0.0:8081 (health only, plaintext)\n" in out
    assert "  auth:     jwt, keys from https://i.example/jwks (not fetched here)\n" in out
