"""``sidecar.config.keys`` through ``load_settings``: which base a relative path is read against, and the key a
misspelt one was meant to be."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import Settings, load_settings
from sidecar.config.keys import close_key
from sidecar.errors import ConfigError


def _config(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "toolbooth.yaml"
    path.write_text(text)
    return path


def test_the_files_paths_are_read_against_its_directory_the_variables_against_the_working_one(
        tmp_path: Path) -> None:
    config = _config(tmp_path / "etc", "store:\n  sqlite_path: ../state/tb.db\naudit:\n  checkpoint_file: /abs/cp\n"
                                       "policy:\n  path: policies\n")
    settings = load_settings(config, env={"TOOLBOOTH_STORE__JOURNAL_FILE": "tb.journal"})
    assert settings.store.sqlite_path == tmp_path / "state" / "tb.db"  # ``..`` taken off
    assert settings.policy.path == tmp_path / "etc" / "policies"
    assert settings.audit.checkpoint_file == Path("/abs/cp")
    assert settings.store.journal_file == Path("tb.journal")


def test_a_relative_config_file_anchors_to_its_absolute_directory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path / "etc", "store:\n  sqlite_path: tb.db\n")
    assert load_settings(config.relative_to(tmp_path), env={}).store.sqlite_path == tmp_path / "etc" / "tb.db"


def test_a_path_error_names_the_base(tmp_path: Path) -> None:
    config = _config(tmp_path, "auth:\n  jwt: {issuer: i, audience: a, jwks_url: 'https://idp.test/keys', "
                               "jwks_ca_file: ca.pem}\n")
    with pytest.raises(ConfigError) as from_file:
        load_settings(config, env={})
    assert str(from_file.value) == ("config error at auth.jwt.jwks_ca_file: Path does not point to a file ('ca.pem' "
                                    f"is read against {tmp_path}, the directory of the config file)")
    with pytest.raises(ConfigError) as from_variable:
        load_settings(None, env={"TOOLBOOTH_SERVER__TLS": "{cert_file: c.pem, key_file: /no/k.pem}",
                                 "TOOLBOOTH_SERVER__LISTEN": "['127.0.0.1:5000']"})
    assert f"Path does not point to a file ('c.pem' is read against the working directory {Path.cwd()})" in \
        str(from_variable.value)
    assert "server.tls.key_file (from TOOLBOOTH_SERVER__TLS): Path does not point to a file (/no/k.pem)" in \
        str(from_variable.value)


@pytest.mark.parametrize(("loc", "meant"), [
    (("polcy",), "policy"),
    (("store", "sqlite_pth"), "sqlite_path"),
    (("policy", "bundle", "verification", "keys", "k1", "algorithem"), "algorithm"),
    (("limits", "surprise"), None),
    (("plugins", "config", "email", "smpt"), None),  # a plugin's own settings: not the sidecar's to know
])
def test_close_key(loc: tuple[str, ...], meant: str | None) -> None:
    assert close_key(Settings, loc) == meant
