"""The plugin's configuration: where drafts live, the SMTP server and its credentials, and the sending rules.

Read from a TOML file named by ``TOOLBOOTH_EMAIL_CONFIG`` (optional; every key has a default; ``drafts_dsn``
puts the drafts in PostgreSQL), then from the environment: ``TOOLBOOTH_EMAIL_DB`` (the SQLite file of the
drafts), ``TOOLBOOTH_EMAIL_SMTP_USERNAME`` and ``TOOLBOOTH_EMAIL_SMTP_PASSWORD``. The password comes from
that variable or from the file ``smtp.password_file`` names, never from the config file itself nor from a
tool's arguments.

The rules mirror the policy data of the sidecar (``data.toolbooth.email``): ``rules.policy_data`` may name
that ``data.json``, and its ``internal_domains``, ``external_permission`` and the roles granting that
permission then come from it, so one file rules both the Rego check of a preview's arguments and this
plugin's re-check of a draft at send time.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = ["ConfigError", "EmailSettings", "Rules", "Sender", "SmtpSettings", "load_settings"]

CONFIG_ENV = "TOOLBOOTH_EMAIL_CONFIG"
DB_ENV = "TOOLBOOTH_EMAIL_DB"
USERNAME_ENV = "TOOLBOOTH_EMAIL_SMTP_USERNAME"
PASSWORD_ENV = "TOOLBOOTH_EMAIL_SMTP_PASSWORD"


class ConfigError(ValueError):
    """The plugin's configuration cannot be used; the message names the file and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sender(_Section):
    """The ``From`` of every message."""

    email: str = "toolbooth@example.com"
    display_name: str | None = "Toolbooth"


class SmtpSettings(_Section):
    """The server every message goes to. ``security``: ``starttls`` (upgrade, required: a server that does not
    offer it gets nothing), ``tls`` (implicit TLS from the first byte, usually port 465) or ``none`` (plain
    text: a local relay only). The server's certificate is verified (``validate_certs``) against the system's
    CAs, or those of ``cert_bundle``. Credentials go only over TLS; ``allow_plaintext_login`` lets them go
    in clear to a loopback relay, and nowhere else."""

    host: str = "localhost"
    port: int = Field(default=25, ge=1, le=65535)
    security: Literal["starttls", "tls", "none"] = "none"
    username: str | None = None
    password_file: Path | None = None
    password: SecretStr | None = Field(default=None, exclude=True)  # set from the env or password_file only
    timeout_seconds: float = Field(default=8.0, gt=0, le=60)
    validate_certs: bool = True
    cert_bundle: FilePath | None = None  # a PEM file of the CAs to trust instead of the system's
    allow_plaintext_login: bool = False

    @model_validator(mode="after")
    def _plaintext_login_to_loopback_only(self) -> SmtpSettings:
        if self.allow_plaintext_login and not _is_loopback(self.host):
            raise ValueError(f"allow_plaintext_login is allowed only for a loopback host, not {self.host!r}")
        return self


def _is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost`` or a loopback address): traffic that never leaves it."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Rules(_Section):
    """What may be sent: checked at preview and again at send time."""

    internal_domains: tuple[str, ...] = ("example.com",)
    blocked_domains: tuple[str, ...] = ()
    max_recipients: int = Field(default=20, ge=1, le=1000)
    external_permission: str = "email:send_external"
    external_roles: tuple[str, ...] = ("admin",)  # roles that grant external_permission
    require_approval: bool = True  # send_email sends only a rendering a person approved
    policy_data: Path | None = None


class EmailSettings(_Section):
    """The whole configuration."""

    sender: Sender = Sender()
    smtp: SmtpSettings = SmtpSettings()
    rules: Rules = Rules()
    drafts_path: Path = Field(default_factory=lambda: _state_dir() / "email-drafts.db")
    drafts_dsn: SecretStr | None = None  # a PostgreSQL database for the drafts, instead of the SQLite file
    draft_ttl_seconds: int = Field(default=900, ge=1, le=7 * 24 * 3600)

    @field_validator("drafts_dsn")
    @classmethod
    def _a_dsn(cls, dsn: SecretStr | None) -> SecretStr | None:
        if dsn is not None:
            try:
                conninfo_to_dict(dsn.get_secret_value())
            except psycopg.ProgrammingError:  # its message quotes the string, password included: not passed on
                raise ValueError("not a PostgreSQL connection string (postgresql://USER@HOST:PORT/DBNAME or "
                                 "key=value pairs)") from None
        return dsn


def load_settings() -> EmailSettings:
    """The configuration the environment names now (cached per environment)."""
    return _load(os.environ.get(CONFIG_ENV), os.environ.get(DB_ENV), os.environ.get(USERNAME_ENV),
                 os.environ.get(PASSWORD_ENV))


@lru_cache(maxsize=8)
def _load(config: str | None, db: str | None, username: str | None, password: str | None) -> EmailSettings:
    raw: dict[str, Any] = _read_toml(Path(config)) if config else {}
    if db:
        raw["drafts_path"] = db
    smtp = dict(raw.get("smtp") or {})
    if "password" in smtp:
        raise ConfigError(f"{config}: smtp.password is not read from the config file; set {PASSWORD_ENV} "
                          "or smtp.password_file")
    if username:
        smtp["username"] = username
    secret = password if password is not None else _read_secret(smtp.get("password_file"), config)
    raw["smtp"] = {**smtp, **({"password": secret} if secret is not None else {})}
    try:
        settings = EmailSettings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False))
        raise ConfigError(f"{config or 'the email plugin configuration'}: {problems}") from None
    if settings.rules.policy_data is not None:
        settings = settings.model_copy(update={"rules": _with_policy_data(settings.rules)})
    return settings


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the email plugin configuration: {exc}") from None


def _read_secret(path: object, config: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(str(path)).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{config}: smtp.password_file cannot be read: {exc.strerror}") from None


def _with_policy_data(rules: Rules) -> Rules:
    assert rules.policy_data is not None
    try:
        data = json.loads(rules.policy_data.read_text(encoding="utf-8"))["toolbooth"]
        email = data["email"]
        permission = str(email["external_permission"])
        roles = tuple(sorted(role for role, granted in data.get("role_permissions", {}).items()
                             if permission in granted))
        return rules.model_copy(update={"internal_domains": tuple(map(str, email["internal_domains"])),
                                        "external_permission": permission, "external_roles": roles})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{rules.policy_data}: not policy data with toolbooth.email "
                          f"(internal_domains, external_permission): {exc!r}") from None


def _state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbooth"
