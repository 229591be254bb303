"""Configuration: YAML file, environment overrides, errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.config import AuthMode, load_settings, parse_settings
from sidecar.config.endpoints import check_installed
from sidecar.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toolbooth.yaml"
    path.write_text(text)
    return path


def test_defaults_need_no_file() -> None:
    settings = load_settings(env={})
    assert settings.auth.effective_mode is AuthMode.DEV
    assert settings.server.listen[0].startswith("unix:///")
    assert (settings.policy.path / "authz.rego").is_file()


def test_file_and_env_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  listen: ['127.0.0.1:0']\nlimits:\n  max_argument_bytes: 100\n")
    env = {"TOOLBOOTH_LIMITS__MAX_ARGUMENT_BYTES": "200", "TOOLBOOTH_PLUGINS__ALLOW": "[calculator]",
           "TOOLBOOTH_TEST_OPA_URL": "ignored", "OTHER": "x"}
    settings = load_settings(path, env)
    assert settings.server.listen == ("127.0.0.1:0",)
    assert settings.limits.max_argument_bytes == 200 and settings.plugins.allow == ("calculator",)


def test_jwt_mode_is_chosen_by_a_jwt_section() -> None:
    settings = parse_settings({"auth": {"jwt": {"issuer": "i", "audience": "a", "key": "k", "algorithms": ["HS256"]}}})
    assert settings.auth.effective_mode is AuthMode.JWT


@pytest.mark.parametrize(("raw", "expected"), [
    ({"limits": {"max_argument_bytes": 0}}, "config error at limits.max_argument_bytes: Input should be greater than"),
    ({"limits": {"max_argument_bytes": "lots"}}, "config error at limits.max_argument_bytes: Input should be a valid"),
    ({"limits": {"max_pending_previews_per_principal": 0}},
     "config error at limits.max_pending_previews_per_principal: Input should be greater than 0"),
    ({"surprise": 1}, "config error at surprise: unknown key"),
    ({"server": {"lissen": []}}, "config error at server.lissen: unknown key"),
    ({"server": {"listen": ["foo"]}}, "config error at server.listen: 'foo': expected unix:///path or HOST:PORT"),
    ({"server": {"listen": ["unix://relative.sock"]}}, "must be absolute"),
    ({"server": {"listen": []}}, "config error at server.listen"),
    ({"auth": {"mode": "jwt"}}, "config error at auth: mode 'jwt' needs an 'auth.jwt' section"),
    ({"auth": {"mode": "magic"}}, "config error at auth.mode"),
    ({"auth": {"jwt": {"issuer": "i", "audience": "a"}}}, "exactly one of 'key', 'key_file' or 'jwks_url'"),
    ({"auth": {"jwt": {"issuer": "i", "audience": "a", "key": "k", "algorithms": ["none"]}}}, "'none' is never"),
    ({"auth": {"jwt": {"audience": "a", "key": "k"}}}, "config error at auth.jwt.issuer: Field required"),
    ({"auth": {"dev_principal": {"id": ""}}}, "config error at auth.dev_principal.id"),
    ({"policy": {"engine": "rego"}}, "config error at policy.engine: Input should be 'embedded' or 'opa'"),
    ({"policy": {"engine": "opa"}}, "config error at policy: engine 'opa' needs a 'policy.opa' section"),
    ({"policy": {"opa": {"token": "t"}}}, "config error at policy.opa.url: Field required"),
    ({"policy": {"opa": {"url": "opa:8181"}}}, "config error at policy.opa.url: 'opa:8181': expected http(s)://"),
    ({"policy": {"opa": {"url": "http://opa:8181/v1/data"}}}, "config error at policy.opa.url: "
                                                              "'http://opa:8181/v1/data': the URL of the server only"),
    ({"policy": {"opa": {"url": "http://opa:http"}}}, "config error at policy.opa.url: Port could not be cast"),
    ({"policy": {"opa": {"url": "http://o", "timeout_seconds": 0}}}, "config error at policy.opa.timeout_seconds: "
                                                                      "Input should be greater than 0"),
    ({"policy": {"opa": {"url": "http://o", "upload_policies": "sometimes"}}}, "config error at "
                                                                               "policy.opa.upload_policies"),
    ({"policy": {"opa": {"url": "http://o", "tsl": {}}}}, "config error at policy.opa.tsl: unknown key"),
    ({"policy": {"opa": {"url": "https://o", "tls": {"ca_file": "/no/such/ca.pem"}}}},
     "config error at policy.opa.tls.ca_file: Path does not point to a file"),
    ({"policy": {"opa": {"url": "https://o", "tls": {"cert_file": "/no/such/cert.pem"}}}},
     "config error at policy.opa.tls.cert_file: Path does not point to a file"),
    ({"log_level": "LOUD"}, "config error at log_level"),
    ({"logging": {"format": "xml"}}, "config error at logging.format: Input should be 'text' or 'json'"),
    ({"logging": {"level": "DEBUG"}}, "config error at logging.level: unknown key"),
    ({"logging": {"access": "sometimes"}}, "config error at logging.access: Input should be a valid boolean"),
    ({"policy": {"reload_interval_seconds": -1}}, "config error at policy.reload_interval_seconds"),
    ({"policy": {"cache": {"ttl_seconds": 0}}}, "config error at policy.cache.ttl_seconds"),
    ({"policy": {"cache": {"max_entries": 0}}}, "config error at policy.cache.max_entries"),
    ({"policy": {"cache": {"size": 1}}}, "config error at policy.cache.size: unknown key"),
    ({"store": {"postgres_dsn": ""}}, "config error at store.postgres_dsn: Value should have at least 1"),
    ({"store": {"postgres_dsn": "host"}}, "config error at store.postgres_dsn: not a valid PostgreSQL connection"),
    ({"store": {"pool_min_size": -1}}, "config error at store.pool_min_size: Input should be greater than or equal"),
    ({"store": {"pool_max_size": 0}}, "config error at store.pool_max_size: Input should be greater than 0"),
    ({"store": {"pool_min_size": 5, "pool_max_size": 2}},
     "config error at store.pool_max_size: must be at least pool_min_size (5)"),
    ({"store": {"connect_timeout_seconds": 0}}, "config error at store.connect_timeout_seconds: Input should be"),
    ({"store": {"down_wait_seconds": 0}}, "config error at store.down_wait_seconds: Input should be greater than 0"),
    ({"store": {"audit_linger_ms": -1}},
     "config error at store.audit_linger_ms: Input should be greater than or equal to 0"),
    ({"store": {"audit_linger_ms": 5000}},
     "config error at store.audit_linger_ms: Input should be less than or equal to 1000"),
    ({"store": {"down_wait_seconds": "soon"}}, "config error at store.down_wait_seconds: Input should be a valid"),
    ({"store": {"down_wait_seconds": 3, "connect_timeout_seconds": 2}},
     "down_wait_seconds (3.0) must not be longer than connect_timeout_seconds (2.0)"),
])
def test_errors_name_the_key(raw: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(raw)
    assert expected in str(info.value)


def test_every_error_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"limits": {"max_argument_bytes": 0, "max_argument_depth": 0}})
    assert len(str(info.value).splitlines()) == 2


@pytest.mark.parametrize(("text", "expected"), [
    ("server: [unclosed", "is not valid YAML"),
    ("- a list\n", "must contain a mapping"),
])
def test_bad_files(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_settings(write(tmp_path, text), {})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml", {})


def test_env_value_into_a_scalar_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"config error at log_level\.deep: 'log_level' is not a section"):
        load_settings(None, {"TOOLBOOTH_LOG_LEVEL": "INFO", "TOOLBOOTH_LOG_LEVEL__DEEP": "x"})


def test_unreadable_jwt_key_file(tmp_path: Path) -> None:
    settings = parse_settings({"auth": {"jwt": {"issuer": "i", "audience": "a", "key_file": str(tmp_path / "k")}}})
    assert settings.auth.jwt is not None
    with pytest.raises(ConfigError, match=r"auth\.jwt\.key_file: cannot read"):
        settings.auth.jwt.verification_key()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "[::1]:1", "localhost:1", "unix:///run/x.sock"])
def test_dev_mode_listens_on_loopback(address: str) -> None:
    assert parse_settings({"server": {"listen": [address]}}).server.listen == (address,)


def test_dev_mode_refuses_public_addresses_but_jwt_mode_may() -> None:
    with pytest.raises(ConfigError, match=r"'0\.0\.0\.0:1' is not a loopback address; auth mode 'dev'"):
        parse_settings({"server": {"listen": ["0.0.0.0:1"]}})
    jwt = {"issuer": "i", "audience": "a", "key": "k", "algorithms": ["HS256"]}
    assert parse_settings({"server": {"listen": ["0.0.0.0:1"]}, "auth": {"jwt": jwt}}).server.listen == ("0.0.0.0:1",)


def test_the_mcp_endpoint_is_off_by_default_and_listens_on_one_tcp_address() -> None:
    assert parse_settings({}).mcp.listen is None and parse_settings({}).mcp.endpoint is None
    settings = parse_settings({"mcp": {"listen": "127.0.0.1:8765"}})
    assert (settings.mcp.endpoint.host, settings.mcp.endpoint.port) == ("127.0.0.1", 8765)  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"config error at mcp\.listen: 'unix:///x\.sock': the MCP endpoint "
                                          r"listens on one TCP address, HOST:PORT or \[IPV6\]:PORT"):
        parse_settings({"mcp": {"listen": "unix:///x.sock"}})
    with pytest.raises(ConfigError, match=r"config error at mcp\.listen: 'nowhere': expected unix:///path or "
                                          r"HOST:PORT"):
        parse_settings({"mcp": {"listen": "nowhere"}})


def test_mcp_sessions_are_bounded_per_principal_below_the_cap_of_all() -> None:
    mcp = parse_settings({}).mcp
    assert (mcp.session_idle_seconds, mcp.max_sessions_per_principal, mcp.max_sessions) == (600, 16, 1000)
    with pytest.raises(ConfigError, match=r"^config error at mcp: max_sessions_per_principal \(16\) must be below "
                                          r"max_sessions \(16\), or one principal could take every session$"):
        parse_settings({"mcp": {"max_sessions": 16}})
    with pytest.raises(ConfigError, match=r"^config error at mcp\.session_idle_seconds: Input should be greater "
                                          r"than 0$"):
        parse_settings({"mcp": {"session_idle_seconds": 0}})
    with pytest.raises(ConfigError, match=r"^config error at mcp\.max_sessions_per_principal: Input should be "
                                          r"greater than 0$"):
        parse_settings({"mcp": {"max_sessions_per_principal": 0}})


def test_an_mcp_initialize_is_bounded_within_the_bound_of_every_message() -> None:
    assert parse_settings({}).mcp.max_initialize_bytes == 64 * 1024
    at_most = {"mcp": {"max_initialize_bytes": 2**20}, "limits": {"max_message_bytes": 2**20}}
    assert parse_settings(at_most).mcp.max_initialize_bytes == 2**20
    with pytest.raises(ConfigError, match=r"^config error at \(top level\): mcp\.max_initialize_bytes \(4194305\) must "
                                          r"be at most limits\.max_message_bytes \(4194304\), the bound of every "
                                          r"message$"):
        parse_settings({"mcp": {"max_initialize_bytes": 4 * 1024 * 1024 + 1}})
    with pytest.raises(ConfigError, match=r"^config error at mcp\.max_initialize_bytes: Input should be greater "
                                          r"than 0$"):
        parse_settings({"mcp": {"max_initialize_bytes": 0}})


def test_metrics_are_off_by_default_and_listen_on_one_tcp_address() -> None:
    assert parse_settings({}).metrics.listen is None and parse_settings({}).metrics.endpoint is None
    settings = parse_settings({"metrics": {"listen": "[::1]:9464"}})
    assert (settings.metrics.endpoint.host, settings.metrics.endpoint.port) == ("[::1]", 9464)  # type: ignore[union-attr]
    # scrapes only, no tool API: beyond loopback in dev mode too, like the health-only listener
    assert parse_settings({"metrics": {"listen": "0.0.0.0:9464"}}).metrics.listen == "0.0.0.0:9464"
    with pytest.raises(ConfigError, match=r"config error at metrics\.listen: 'unix:///m\.sock': the metrics "
                                          r"endpoint listens on one TCP address"):
        parse_settings({"metrics": {"listen": "unix:///m.sock"}})
    with pytest.raises(ConfigError, match=r"config error at metrics\.listen: 'ipv4:127\.0\.0\.1:1,127\.0\.0\.1:2': "
                                          r"the metrics endpoint listens on one TCP address"):
        parse_settings({"metrics": {"listen": "ipv4:127.0.0.1:1,127.0.0.1:2"}})
    with pytest.raises(ConfigError, match=r"config error at metrics\.listen: '127\.0\.0\.1:99999': the port 99999 "
                                          r"is out of range"):
        parse_settings({"metrics": {"listen": "127.0.0.1:99999"}})
    with pytest.raises(ConfigError, match=r"config error at metrics\.path: unknown key"):
        parse_settings({"metrics": {"path": "/m"}})
    with pytest.raises(ConfigError, match=r"config error at metrics\.listen \(from TOOLBOOTH_METRICS__LISTEN\): "
                                          r"'nowhere': expected unix:///path or HOST:PORT"):
        load_settings(env={"TOOLBOOTH_METRICS__LISTEN": "nowhere"})


def test_dev_mode_refuses_an_mcp_endpoint_on_a_public_address() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_settings({"mcp": {"listen": "0.0.0.0:8765"}})
    assert str(raised.value) == (
        "config error at (top level): mcp.listen: '0.0.0.0:8765' is not a loopback address; auth mode 'dev' trusts "
        "a static principal, so it only listens on 127.0.0.1, ::1, localhost or a unix socket (configure auth.jwt "
        "to listen elsewhere)")
    jwt = {"issuer": "i", "audience": "a", "key": "k", "algorithms": ["HS256"]}
    assert parse_settings({"mcp": {"listen": "0.0.0.0:8765"}, "auth": {"jwt": jwt}}).mcp.listen == "0.0.0.0:8765"


def test_serving_mcp_without_the_sdk_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    settings = parse_settings({"mcp": {"listen": "127.0.0.1:8765"}})
    with pytest.raises(ConfigError, match=r"config error at mcp\.listen: serving MCP needs the 'mcp' extra "
                                          r"\(pip install 'toolbooth\[mcp\]'\)"):
        check_installed(settings)
    check_installed(parse_settings({}))  # off: nothing to need


def test_opa_engine_settings(tmp_path: Path) -> None:
    pem = tmp_path / "client.pem"
    pem.write_text("x")
    env = {"TOOLBOOTH_POLICY__ENGINE": "opa", "TOOLBOOTH_POLICY__OPA__URL": "https://opa.internal:8181/",
           "TOOLBOOTH_POLICY__OPA__TOKEN": "s3cret", "TOOLBOOTH_POLICY__OPA__TLS__CERT_FILE": str(pem),
           "TOOLBOOTH_POLICY__OPA__TLS__KEY_FILE": str(pem)}
    opa = load_settings(None, env).policy.opa
    assert opa is not None and opa.url == "https://opa.internal:8181"
    assert (opa.timeout_seconds, opa.upload_policies) == (0.5, True)
    assert opa.token is not None and opa.token.get_secret_value() == "s3cret" and "s3cret" not in repr(opa)
    assert opa.tls is not None and opa.tls.key_file == pem


@pytest.mark.parametrize(("url", "keys", "expected"), [
    ("https://o", ["key_file"], "config error at policy.opa.tls: 'key_file' needs 'cert_file'"),
    ("http://o", ["ca_file"], "config error at policy.opa: 'tls' needs an https:// url"),
])
def test_opa_tls_errors_name_the_key(tmp_path: Path, url: str, keys: list[str], expected: str) -> None:
    pem = tmp_path / "file.pem"
    pem.write_text("x")
    with pytest.raises(ConfigError) as info:
        parse_settings({"policy": {"opa": {"url": url, "tls": {key: str(pem) for key in keys}}}})
    assert expected in str(info.value)


@pytest.mark.parametrize(("policy", "expected"), [
    ({"engine": "opa", "opa": {"url": "http://127.0.0.1:8181"}, "bundle": {"file": "/b.tar.gz"}},
     "'bundle' is for the embedded engine"),
    ({"bundle": {"file": "/b.tar.gz"}, "reload_requires_tests": True}, "a bundle carries no tests"),
])
def test_bundle_combinations_that_cannot_work(policy: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_settings({"policy": policy})


def test_postgres_store_settings() -> None:
    env = {"TOOLBOOTH_STORE__POSTGRES_DSN": "postgresql://tb:s3cret@db.internal:6432/toolbooth?sslmode=require",
           "TOOLBOOTH_STORE__POOL_MAX_SIZE": "20"}
    store = load_settings(None, env).store
    assert store.postgres_dsn is not None and "s3cret" in store.postgres_dsn.get_secret_value()
    assert (store.pool_min_size, store.pool_max_size, store.connect_timeout_seconds) == (1, 20, 5.0)
    assert "s3cret" not in repr(store)
    assert store.describe() == "postgres postgresql://tb@db.internal:6432/toolbooth (pool 1-20)"
    assert load_settings(None, {}).store.describe().startswith("sqlite /")


@pytest.mark.parametrize("dsn", ["host=db password=s3cret dbname=tb", "postgresql://tb:s3cret@db/tb",
                                 "host=db password='s3cret", "postgresql://tb:s3cret@[db/tb"])
def test_the_dsn_password_is_never_shown(dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        shown = parse_settings({"store": {"postgres_dsn": dsn}}).store.describe()
    except ConfigError as exc:
        shown = str(exc)
    assert "s3cret" not in shown and "postgres" in shown
    config = write(tmp_path, f"store:\n  postgres_dsn: \"{dsn}\"\n")
    main(["config", "validate", "--config", str(config)])
    output = capsys.readouterr()
    assert "s3cret" not in output.out + output.err and "postgres" in output.out + output.err


def test_the_command_line_clients_variables_are_not_settings() -> None:
    settings = load_settings(None, {"TOOLBOOTH_TOKEN": "abc", "TOOLBOOTH_TARGET": "unix:///x.sock",
                                    "TOOLBOOTH_TOKEN_FILE": "/run/secrets/token"})
    assert settings.auth.effective_mode is AuthMode.DEV


def test_unparsable_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"config error at limits\.max_argument_bytes: cannot parse "
                                          r"TOOLBOOTH_LIMITS__MAX_ARGUMENT_BYTES"):
        load_settings(None, {"TOOLBOOTH_LIMITS__MAX_ARGUMENT_BYTES": "[unclosed"})
