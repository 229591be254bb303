"""The plugin's settings, ``plugins.config.email`` of the sidecar's configuration (``EmailSettings``): where drafts
live, the SMTP server and its credentials, and the sending rules.

Every key has a default and can be set by ``TOOLBOOTH_PLUGINS__CONFIG__EMAIL__<SECTION>__<KEY>`` too;
``drafts_dsn`` puts the drafts in PostgreSQL instead of the SQLite file ``drafts_path``. The SMTP password is
``smtp.password`` (best from that variable, e.g. a Kubernetes secret) or the file ``smtp.password_file`` names
(a mounted secret; read when the settings are validated), never a tool's argument.

The rules mirror the policy data of the sidecar (``data.toolbooth.email``): ``rules.policy_data`` may name
that ``data.json``, and its ``internal_domains``, ``external_permission`` and the roles granting that
permission then come from it, so one file rules both the Rego check of a preview's arguments and this
plugin's re-check of a draft at send time.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FilePath, SecretStr, field_validator, model_validator

__all__ = ["EmailSettings", "Rules", "Sender", "SmtpSettings"]


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
    password: SecretStr | None = None  # inline, or read from password_file: at most one of them
    password_file: Path | None = None
    timeout_seconds: float = Field(default=8.0, gt=0, le=60)
    validate_certs: bool = True
    cert_bundle: FilePath | None = None  # a PEM file of the CAs to trust instead of the system's
    allow_plaintext_login: bool = False

    @model_validator(mode="before")
    @classmethod
    def _password_from_its_file(cls, data: Any) -> Any:
        """``password_file``'s text (stripped) becomes ``password``."""
        if not isinstance(data, dict) or data.get("password_file") is None:
            return data
        if data.get("password") is not None:
            raise ValueError("set at most one of 'password' or 'password_file'")
        path = Path(str(data["password_file"]))
        try:
            secret = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"password_file: cannot read {path}: {exc.strerror or exc}") from None
        return {**data, "password": secret}

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

    @model_validator(mode="before")
    @classmethod
    def _from_policy_data(cls, data: Any) -> Any:
        """``policy_data``'s ``internal_domains``, ``external_permission`` and the roles granting it win."""
        if not isinstance(data, dict) or data.get("policy_data") is None:
            return data
        path = Path(str(data["policy_data"]))
        try:
            policy = json.loads(path.read_text(encoding="utf-8"))["toolbooth"]
            email = policy["email"]
            permission = str(email["external_permission"])
            roles = sorted(role for role, granted in policy.get("role_permissions", {}).items()
                           if permission in granted)
            domains = [str(domain) for domain in email["internal_domains"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"policy_data: {path} is not policy data with toolbooth.email "
                             f"(internal_domains, external_permission): {exc!r}") from None
        return {**data, "internal_domains": domains, "external_permission": permission, "external_roles": roles}


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
            import psycopg  # loads only for drafts kept in PostgreSQL
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(dsn.get_secret_value())
            except psycopg.ProgrammingError:  # its message quotes the string, password included: not passed on
                raise ValueError("not a PostgreSQL connection string (postgresql://USER@HOST:PORT/DBNAME or "
                                 "key=value pairs)") from None
        return dsn


def _state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbooth"
