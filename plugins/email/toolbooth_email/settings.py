"""The plugin's settings, ``plugins.config.email`` of the sidecar's configuration (``EmailSettings``): where drafts
live, the SMTP server and its credentials, and the sending rules.

Every key has a default and can be set by ``TOOLBOOTH_PLUGINS__CONFIG__EMAIL__<SECTION>__<KEY>`` too. The SMTP
password is ``smtp.password`` (best from that variable, e.g. a Kubernetes secret) or the file
``smtp.password_file`` names (a mounted secret; read when the settings are validated), never a tool's
argument.

The rules mirror the policy data of the sidecar (``data.toolbooth.email``): ``rules.policy_data`` may name
that ``data.json``, and its ``internal_domains``, ``external_permission`` and the roles granting that
permission then come from it, so one file rules both the Rego check of a preview's arguments and this
plugin's re-check of a draft at send time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["EmailSettings", "Rules", "Sender", "SmtpSettings"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sender(_Section):
    """The ``From`` of every message."""

    email: str = "toolbooth@example.com"
    display_name: str | None = "Toolbooth"


class SmtpSettings(_Section):
    """The server every message goes to. ``security``: ``starttls`` (upgrade, required), ``tls`` (implicit
    TLS from the first byte, usually port 465) or ``none`` (plain text: a local relay only)."""

    host: str = "localhost"
    port: int = Field(default=25, ge=1, le=65535)
    security: Literal["starttls", "tls", "none"] = "none"
    username: str | None = None
    password: SecretStr | None = None  # inline, or read from password_file: at most one of them
    password_file: Path | None = None
    timeout_seconds: float = Field(default=8.0, gt=0, le=60)
    validate_certs: bool = True
    cert_bundle: Path | None = None

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
    draft_ttl_seconds: int = Field(default=900, ge=1, le=7 * 24 * 3600)


def _state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbooth"
