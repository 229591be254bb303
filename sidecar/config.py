"""The one configuration model: a YAML file plus ``TOOLBOOTH_*`` environment overrides.

Validated at start; every error names the key that is wrong, e.g.
``config error at limits.max_argument_bytes: Input should be greater than 0``.
Environment variables override file values: ``TOOLBOOTH_STORE__SQLITE_PATH=/x.db``
sets ``store.sqlite_path`` (sections and keys joined by a double underscore; values
are parsed as YAML, so ``[a, b]`` is a list and ``true`` a boolean).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sidecar.contract import Principal
from sidecar.errors import ConfigError
from sidecar.state.dsn import dsn_parts, redact_dsn

__all__ = [
    "CLIENT_VARIABLES",
    "ENV_PREFIX",
    "ENV_TARGET",
    "ENV_TOKEN",
    "MIN_MASK_KEY_BYTES",
    "UNIX_PREFIX",
    "AuditSettings",
    "AuthMode",
    "AuthSettings",
    "BundleKeySettings",
    "BundleSettings",
    "BundleVerificationSettings",
    "DecisionCacheSettings",
    "JwtSettings",
    "Limits",
    "OpaSettings",
    "OpaTlsSettings",
    "PluginSettings",
    "PolicyEngineKind",
    "PolicySettings",
    "ServerSettings",
    "Settings",
    "StoreSettings",
    "bundled_policy_dir",
    "default_socket_path",
    "default_state_dir",
    "is_loopback",
    "load_settings",
    "parse_settings",
]

MIN_MASK_KEY_BYTES = 16

ENV_PREFIX = "TOOLBOOTH_"
# Read by the command-line client, not settings of the sidecar.
ENV_TARGET, ENV_TOKEN = "TOOLBOOTH_TARGET", "TOOLBOOTH_TOKEN"
CLIENT_VARIABLES = frozenset({ENV_TARGET, ENV_TOKEN})
UNIX_PREFIX = "unix://"
_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})



def default_socket_path() -> Path:
    """Default Unix socket: under ``$XDG_RUNTIME_DIR`` or a per-user directory in /tmp."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/toolbooth-{os.getuid()}"
    return Path(runtime) / "toolbooth" / "toolbooth.sock"


def default_state_dir() -> Path:
    """Default directory for the SQLite store."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbooth"


def bundled_policy_dir() -> Path:
    """The default policies: bundled in the wheel, or ``policies/`` of a source checkout."""
    here = Path(__file__).resolve().parent
    bundled = here / "_bundled_policies" / "toolbooth"
    return bundled if bundled.is_dir() else here.parent / "policies" / "toolbooth"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AuthMode(StrEnum):
    DEV = "dev"
    JWT = "jwt"


class _KeySource(_Section):
    """A key given inline (``key``) or as a file (``key_file``): exactly one of them."""

    key: str | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _one_key(self) -> _KeySource:
        if (self.key is None) == (self.key_file is None):
            raise ValueError("exactly one of 'key' or 'key_file' must be set")
        return self

    def read_key(self, where: str) -> str:
        """The key's text; ``ConfigError`` at ``where.key_file`` when the file cannot be read."""
        if self.key is not None:
            return self.key
        assert self.key_file is not None
        try:
            return self.key_file.read_text()
        except OSError as exc:
            raise ConfigError(f"config error at {where}.key_file: cannot read {self.key_file}: {exc}") from exc


class JwtSettings(_KeySource):
    """Verification of the bearer token in the ``authorization`` metadata."""

    algorithms: tuple[str, ...] = ("RS256", "ES256")
    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    leeway_seconds: float = Field(default=30.0, ge=0)
    tenant_claim: str = "tenant"
    roles_claim: str = "roles"
    permissions_claim: str = "permissions"

    @field_validator("algorithms")
    @classmethod
    def _known_algorithms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        allowed = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA", "HS256", "HS384", "HS512"}
        if not value:
            raise ValueError("at least one algorithm is required")
        if bad := [a for a in value if a not in allowed]:
            raise ValueError(f"unsupported algorithm(s) {bad}; 'none' is never accepted")
        return value

    def verification_key(self) -> str:
        """The PEM (or HMAC secret) tokens are verified with."""
        return self.read_key("auth.jwt")


class AuthSettings(_Section):
    """``dev`` trusts a static principal (loopback only); ``jwt`` verifies tokens."""

    mode: AuthMode | None = None
    jwt: JwtSettings | None = None
    dev_principal: Principal = Principal(id="dev", tenant="dev", roles=("developer",), permissions=())
    # Who may read operator details, e.g. why a policy change was refused (dev mode: everyone).
    operator_roles: tuple[str, ...] = ("operator", "admin")

    @model_validator(mode="after")
    def _mode_matches(self) -> AuthSettings:
        if self.mode is AuthMode.JWT and self.jwt is None:
            raise ValueError("mode 'jwt' needs an 'auth.jwt' section")
        return self

    @property
    def effective_mode(self) -> AuthMode:
        """No mode given: ``jwt`` when a jwt section exists, else ``dev``."""
        if self.mode is not None:
            return self.mode
        return AuthMode.JWT if self.jwt is not None else AuthMode.DEV


class PolicyEngineKind(StrEnum):
    EMBEDDED = "embedded"
    OPA = "opa"


class OpaTlsSettings(_Section):
    """Trust and client certificate for an ``https`` OPA; each file must exist at start."""

    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None

    @model_validator(mode="after")
    def _key_needs_cert(self) -> OpaTlsSettings:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("'key_file' needs 'cert_file'")
        return self


class OpaSettings(_Section):
    """An OPA server evaluating the policies over its REST API."""

    url: str
    token: SecretStr | None = None
    tls: OpaTlsSettings | None = None
    timeout_seconds: float = Field(default=0.5, gt=0)
    upload_policies: bool = True

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
            raise ValueError(f"{value!r}: expected http(s)://HOST[:PORT]")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError(f"{value!r}: the URL of the server only, without a path (the engine adds /v1/...)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _tls_needs_https(self) -> OpaSettings:
        if self.tls is not None and not self.url.startswith("https:"):
            raise ValueError("'tls' needs an https:// url")
        return self


class DecisionCacheSettings(_Section):
    """Recent decisions answered from memory (``sidecar.policy.cache``)."""

    enabled: bool = True
    ttl_seconds: float = Field(default=5.0, gt=0)
    max_entries: int = Field(default=10_000, gt=0)


class BundleKeySettings(_KeySource):
    """A key trusted to sign bundles: a PEM public key (RS*, PS*, ES*) or an HMAC secret (HS*)."""

    algorithm: str = Field(default="RS256", pattern="^(RS|PS|ES|HS)(256|384|512)$")


class BundleVerificationSettings(_Section):
    """Signature verification of bundles, as OPA's ``keys`` and ``bundles.*.signing``."""

    keys: dict[str, BundleKeySettings] = Field(min_length=1)
    keyid: str | None = None  # verify with this key whatever the signature names
    scope: str | None = None
    required: bool = True  # refuse unsigned bundles

    @model_validator(mode="after")
    def _keyid_is_a_key(self) -> BundleVerificationSettings:
        if self.keyid is not None and self.keyid not in self.keys:
            raise ValueError(f"keyid {self.keyid!r} is not one of the keys ({', '.join(sorted(self.keys))})")
        return self


class BundleSettings(_Section):
    """An OPA bundle as the policy source, instead of ``policy.path``: a file, or a URL polled with ETag."""

    url: str | None = Field(default=None, pattern="^https?://[^/]")
    file: Path | None = None
    polling_seconds: float = Field(default=60.0, gt=0)
    timeout_seconds: float = Field(default=10.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. Authorization for a private bundle server
    verification: BundleVerificationSettings | None = None

    @model_validator(mode="after")
    def _one_location(self) -> BundleSettings:
        if (self.url is None) == (self.file is None):
            raise ValueError("exactly one of 'url' or 'file' must be set")
        return self


class PolicySettings(_Section):
    engine: PolicyEngineKind = PolicyEngineKind.EMBEDDED
    path: Path = Field(default_factory=bundled_policy_dir)
    opa: OpaSettings | None = None
    bundle: BundleSettings | None = None
    reload_interval_seconds: float = Field(default=2.0, ge=0)  # 0: never reload
    reload_requires_tests: bool = False
    cache: DecisionCacheSettings = Field(default_factory=DecisionCacheSettings)

    @model_validator(mode="after")
    def _bundle_fits(self) -> PolicySettings:
        if self.bundle is not None and self.engine is PolicyEngineKind.OPA:
            raise ValueError("'bundle' is for the embedded engine; let OPA load bundles itself "
                             "(opa.upload_policies: false)")
        if self.bundle is not None and self.reload_requires_tests:
            raise ValueError("'reload_requires_tests' runs the tests of policy.path; a bundle carries no tests "
                             "(run `toolbooth policy test` before `toolbooth policy bundle build`)")
        return self

    @model_validator(mode="after")
    def _opa_needs_server(self) -> PolicySettings:
        if self.engine is PolicyEngineKind.OPA and self.opa is None:
            raise ValueError("engine 'opa' needs a 'policy.opa' section with the server's url")
        return self


class StoreSettings(_Section):
    """A SQLite file by default; a PostgreSQL database, shared by many replicas, when ``postgres_dsn`` is set."""

    sqlite_path: Path = Field(default_factory=lambda: default_state_dir() / "toolbooth.db")
    busy_timeout_ms: int = Field(default=5000, gt=0)  # lock wait: SQLite's busy timeout, PostgreSQL's lock_timeout
    postgres_dsn: SecretStr | None = Field(default=None, min_length=1)
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, gt=0)
    connect_timeout_seconds: float = Field(default=5.0, gt=0)  # also the wait for a free pooled connection
    idempotency_retention_hours: float = Field(default=24.0, gt=0)  # finished records are deleted after this

    @field_validator("postgres_dsn")
    @classmethod
    def _valid_dsn(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            dsn_parts(value.get_secret_value())
        return value

    @field_validator("pool_max_size")
    @classmethod
    def _max_not_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("pool_min_size")
        if low is not None and value < low:
            raise ValueError(f"must be at least pool_min_size ({low})")
        return value

    def describe(self) -> str:
        """The store in one line, for people: never with the database password."""
        if self.postgres_dsn is None:
            return f"sqlite {self.sqlite_path}"
        dsn = redact_dsn(self.postgres_dsn.get_secret_value())
        return f"postgres {dsn} (pool {self.pool_min_size}-{self.pool_max_size})"


class AuditSettings(_Section):
    """The HMAC key masking sensitive values in the audit log: inline, in a file, or (neither set) a
    random key the store generates once and keeps (``docs/operations.md``)."""

    mask_key: SecretStr | None = None
    mask_key_file: Path | None = None

    @field_validator("mask_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().encode()) < MIN_MASK_KEY_BYTES:
            raise ValueError(f"must be at least {MIN_MASK_KEY_BYTES} bytes")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> AuditSettings:
        if self.mask_key is not None and self.mask_key_file is not None:
            raise ValueError("set at most one of 'mask_key' or 'mask_key_file'")
        return self

    def read_mask_key(self) -> bytes | None:
        """The configured key, ``None`` if none is; ``ConfigError`` if its file cannot be read or is too short."""
        if self.mask_key is not None:
            return self.mask_key.get_secret_value().encode()
        if self.mask_key_file is None:
            return None
        try:
            key = self.mask_key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"config error at audit.mask_key_file: cannot read {self.mask_key_file}: {exc}") from exc
        if len(key) < MIN_MASK_KEY_BYTES:
            raise ConfigError(f"config error at audit.mask_key_file: {self.mask_key_file} holds fewer than "
                              f"{MIN_MASK_KEY_BYTES} bytes")
        return key


class Limits(_Section):
    max_argument_bytes: int = Field(default=64 * 1024, gt=0)
    max_argument_depth: int = Field(default=16, gt=0)
    max_result_bytes: int = Field(default=256 * 1024, gt=0)
    max_message_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    sync_handler_threads: int = Field(default=8, gt=0)


class PluginSettings(_Section):
    """``allow``: entry-point names or distribution names that may load (``None``: all)."""

    allow: tuple[str, ...] | None = None


class ServerSettings(_Section):
    listen: tuple[str, ...] = Field(default_factory=lambda: (f"unix://{default_socket_path()}",), min_length=1)
    reflection: bool | None = None
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)

    @field_validator("listen")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            if address.startswith(UNIX_PREFIX):
                if not address.removeprefix(UNIX_PREFIX).startswith("/"):
                    raise ValueError(f"{address!r}: a unix socket path must be absolute (unix:///path)")
            elif address.rpartition(":")[0] == "" or not address.rpartition(":")[2].isdigit():
                raise ValueError(f"{address!r}: expected unix:///path or HOST:PORT")
        return value


class Settings(_Section):
    """The whole configuration."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    limits: Limits = Field(default_factory=Limits)
    plugins: PluginSettings = Field(default_factory=PluginSettings)
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")

    @model_validator(mode="after")
    def _dev_mode_stays_local(self) -> Settings:
        """Dev mode trusts every caller, so it may only listen where no one else can reach."""
        if self.auth.effective_mode is AuthMode.DEV:
            for address in self.server.listen:
                if not address.startswith(UNIX_PREFIX) and not is_loopback(address.rpartition(":")[0]):
                    raise ValueError(
                        f"server.listen: {address!r} is not a loopback address; auth mode 'dev' trusts a static "
                        "principal, so it only listens on 127.0.0.1, ::1, localhost or a unix socket "
                        "(configure auth.jwt to listen elsewhere)")
        return self


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an IPv4 or a bracketed IPv6 address) is the loopback interface."""
    host = host.removeprefix("[").removesuffix("]")
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (optional), apply environment overrides and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(path)
    _apply_env(raw, os.environ if env is None else env)
    return parse_settings(raw)


def parse_settings(raw: Mapping[str, Any]) -> Settings:
    """Validate a mapping, turning pydantic errors into ``ConfigError`` naming each key."""
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err) for err in exc.errors())) from None


def _describe(err: Mapping[str, Any]) -> str:
    key = ".".join(str(part) for part in err["loc"]) or "(top level)"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    return f"config error at {key}: {message}"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config error: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config error: {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {path} must contain a mapping at the top level")
    return data


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name.startswith(f"{ENV_PREFIX}TEST_") or name in CLIENT_VARIABLES:
            continue
        keys = name.removeprefix(ENV_PREFIX).lower().split("__")
        node = raw
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"config error at {'.'.join(keys)}: {key!r} is not a section (from {name})")
            node = child
        try:
            node[keys[-1]] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"config error at {'.'.join(keys)}: cannot parse {name}={text!r}") from None
