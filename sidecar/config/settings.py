"""The whole configuration (``Settings``) and its other sections, loaded from YAML and ``TOOLBOOTH_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sidecar.config import cpus
from sidecar.config.approvals_ui import ApprovalsUiSettings
from sidecar.config.auth import AuthMode, AuthSettings
from sidecar.config.base import (
    CLIENT_VARIABLES,
    ENV_PREFIX,
    UNIX_PREFIX,
    Section,
    default_socket_path,
)
from sidecar.config.endpoints import ENDPOINTS, Workers
from sidecar.config.http_json import HttpJsonSettings
from sidecar.config.isolation import IsolationSettings
from sidecar.config.keys import Anchored, anchor_paths, close_key, path_note, working_directory_note
from sidecar.config.listen import MAX_PORT, ListenKind, parse_listen
from sidecar.config.logs import LoggingSettings
from sidecar.config.mcp import McpSettings
from sidecar.config.metrics import MetricsSettings
from sidecar.config.policy import PolicySettings
from sidecar.config.store import StoreSettings
from sidecar.config.tls import ServerTlsSettings
from sidecar.errors import ConfigError

__all__ = ["LOG_LEVELS", "MAX_WORKERS", "MIN_MASK_KEY_BYTES", "AuditSettings", "Limits", "Origins", "PluginSettings",
           "ServerSettings", "Settings", "StoreSettings", "describe_errors", "load_settings", "parse_settings"]

MIN_MASK_KEY_BYTES = 16
MAX_WORKERS = 64  # server.workers: processes of one sidecar, at most
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class AuditSettings(Section):
    """The audit log's secrets, never kept in the database (``docs/operations.md``).

    ``mask_key``: the HMAC key masking sensitive values, inline or in ``mask_key_file`` (neither: a
    random key the store generates once and keeps). ``chain_key``: the HMAC key of the hash chain,
    inline or in ``chain_key_file`` (neither: the chain is unkeyed SHA-256 and no checkpoint is
    written); every sidecar sharing a store must have the same one. ``checkpoint_file``: where the
    signed checkpoint goes (default: next to the SQLite file, else in the state directory), written
    every ``checkpoint_interval_seconds`` (0: only at shutdown) and at shutdown.
    """

    mask_key: SecretStr | None = None
    mask_key_file: Path | None = None
    chain_key: SecretStr | None = None
    chain_key_file: Path | None = None
    checkpoint_file: Path | None = None
    checkpoint_interval_seconds: float = Field(default=60.0, ge=0)

    @field_validator("mask_key", "chain_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().encode()) < MIN_MASK_KEY_BYTES:
            raise ValueError(f"must be at least {MIN_MASK_KEY_BYTES} bytes")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> AuditSettings:
        for name in ("mask_key", "chain_key"):
            if getattr(self, name) is not None and getattr(self, f"{name}_file") is not None:
                raise ValueError(f"set at most one of '{name}' or '{name}_file'")
        return self

    def read_mask_key(self) -> bytes | None:
        """The configured key, ``None`` if none is; ``ConfigError`` if its file cannot be read or is too short."""
        return _read_key("mask_key_file", self.mask_key, self.mask_key_file)

    def read_chain_key(self) -> bytes | None:
        """The configured chain key, ``None`` if none is; ``ConfigError`` if its file cannot be read or is
        too short."""
        return _read_key("chain_key_file", self.chain_key, self.chain_key_file)

    def checkpoint_path(self, store: StoreSettings) -> Path:
        """``checkpoint_file``, else ``<sqlite file>.checkpoint`` (SQLite) or ``audit.checkpoint`` in the state
        directory (PostgreSQL)."""
        return self.checkpoint_file or store.checkpoint_path()


def _read_key(name: str, inline: SecretStr | None, file: Path | None) -> bytes | None:
    """The key given inline or in ``file`` (the setting ``audit.<name>``), ``None`` if neither is."""
    if inline is not None:
        return inline.get_secret_value().encode()
    if file is None:
        return None
    try:
        key = file.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"config error at audit.{name}: cannot read {file}: {exc.strerror or exc}"
                          f"{working_directory_note(file)}") from exc
    if len(key) < MIN_MASK_KEY_BYTES:
        raise ConfigError(f"config error at audit.{name}: {file} holds fewer than {MIN_MASK_KEY_BYTES} bytes")
    return key


class Limits(Section):
    max_argument_bytes: int = Field(default=64 * 1024, gt=0)
    max_argument_depth: int = Field(default=16, gt=0)
    max_result_bytes: int = Field(default=256 * 1024, gt=0)
    max_message_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    sync_handler_threads: int = Field(default=8, gt=0)
    max_batch_calls: int = Field(default=64, gt=0)  # calls in one ExecuteToolBatch
    max_batch_concurrency: int = Field(default=16, gt=0)  # a batch's calls running at once: default and cap
    progress_events_per_second: float = Field(default=10.0, gt=0)  # a streamed call's progress reports, at most
    max_pending_previews_per_principal: int = Field(default=100, gt=0)  # unexpired calls one principal has held


# Where a value came from: the key path a ``TOOLBOOTH_*`` variable set, and the variable's name.
Origins = Mapping[tuple[str, ...], str]


class PluginSettings(Section):
    """``allow``: entry-point names or distribution names that may load (``None``: all). ``config``: each
    plugin's own settings, by entry-point name, validated against the model the plugin declares when it
    loads (``sidecar.tools.plugins``)."""

    allow: tuple[str, ...] | None = None
    config: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("config", mode="before")
    @classmethod
    def _empty_sections(cls, value: Any) -> Any:
        """``email:`` with nothing under it is an empty section, as ``email: {}``."""
        if isinstance(value, Mapping):
            return {name: {} if section is None else section for name, section in value.items()}
        return value


class ServerSettings(Section):
    """Where the sidecar listens (``sidecar.config.listen`` reads each address), with TLS on TCP (``tls``), where
    probes ask for its health only (``health_listen``), and how it stops."""

    listen: tuple[str, ...] = Field(default_factory=lambda: (f"{UNIX_PREFIX}{default_socket_path()}",), min_length=1)
    tls: ServerTlsSettings | None = None
    # grpc.health.v1 alone, plaintext, on TCP: for probes (a kubelet's gRPC probe), in dev mode too
    health_listen: str | None = None
    reflection: bool | None = None
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    # processes serving the same TCP addresses (SO_REUSEPORT), each a whole sidecar (``sidecar.server.supervisor``);
    # ``auto``: counted once, as the settings load (``workers_auto`` says from what)
    workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    _workers_auto: cpus.CpuCount | None = PrivateAttr(default=None)

    @property
    def workers_auto(self) -> cpus.CpuCount | None:
        """With ``workers: auto``, the CPUs counted (``sidecar.config.cpus``) and where; else ``None``."""
        return self._workers_auto

    @field_validator("workers", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:  # not true, 1.5 or "2": YAML and the variables give numbers
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not a whole number of worker processes (1-{MAX_WORKERS}) or auto "
                             "(one per CPU the sidecar may use)")
        if not 1 <= value <= MAX_WORKERS:
            raise ValueError(f"Input should be a whole number of worker processes from 1 to {MAX_WORKERS}, or auto "
                             "(one per CPU the sidecar may use)")
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _auto_workers(cls, data: Any, handler: ModelWrapValidatorHandler[ServerSettings]) -> ServerSettings:
        """``workers: auto``: one worker per CPU, at most ``MAX_WORKERS``. It needs TCP whatever it counts, so
        that a configuration valid on one machine is valid on all."""
        if not isinstance(data, Mapping) or data.get("workers") != "auto":
            return handler(data)
        one = handler({**data, "workers": 1})  # every other key, checked as for one process
        for address in one.listen:
            if parse_listen(address).kind is not ListenKind.TCP:
                raise ValueError(f"workers: auto needs TCP addresses only in 'listen', and {address!r} is a Unix "
                                 "socket, which gRPC servers in several processes cannot share: listen on loopback "
                                 "TCP (e.g. 127.0.0.1:50051), or set a number of workers")
        counted = cpus.usable_cpus()
        server = handler({**data, "workers": min(counted.cpus, MAX_WORKERS)})
        server._workers_auto = counted
        return server

    @field_validator("listen", mode="before")
    @classmethod
    def _one_address_is_a_list(cls, value: Any) -> Any:
        """``listen: "127.0.0.1:5000"`` means the list of that one address."""
        return [value] if isinstance(value, str) else value

    @field_validator("listen")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            parse_listen(address)
        return value

    @field_validator("health_listen")
    @classmethod
    def _health_on_tcp(cls, value: str | None) -> str | None:
        if value is not None and parse_listen(value).kind is not ListenKind.TCP:
            raise ValueError(f"{value!r}: the health-only listener is for probes over TCP: HOST:PORT or [IPV6]:PORT")
        return value

    @model_validator(mode="after")
    def _tls_needs_tcp(self) -> ServerSettings:
        if self.tls is not None and all(parse_listen(a).kind is not ListenKind.TCP for a in self.listen):
            raise ValueError("'tls' is set but no address in 'listen' is TCP: TLS applies to TCP addresses only "
                             "(Unix sockets stay plaintext)")
        return self

    @model_validator(mode="after")
    def _workers_share_tcp(self) -> ServerSettings:
        """Workers share TCP ports (SO_REUSEPORT); gRPC servers in several processes cannot share a Unix socket."""
        for address in self.listen if self.workers > 1 else ():
            if parse_listen(address).kind is not ListenKind.TCP:
                raise ValueError(
                    f"workers: {self.workers} needs TCP addresses only in 'listen', and {address!r} is a Unix "
                    "socket, which gRPC servers in several processes cannot share: listen on loopback TCP "
                    "(e.g. 127.0.0.1:50051), or keep workers: 1")
        return self


class Settings(Section):
    """The whole configuration."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    limits: Limits = Field(default_factory=Limits)
    plugins: PluginSettings = Field(default_factory=PluginSettings)
    isolation: IsolationSettings = Field(default_factory=IsolationSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    approvals_ui: ApprovalsUiSettings = Field(default_factory=ApprovalsUiSettings)
    http_json: HttpJsonSettings = Field(default_factory=HttpJsonSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    log_level: str = "INFO"
    _origins: Origins = PrivateAttr(default_factory=dict)

    @property
    def origins(self) -> Origins:
        """Which ``TOOLBOOTH_*`` variable set which key path (empty for settings not loaded from an environment)."""
        return self._origins

    @field_validator("log_level", mode="before")
    @classmethod
    def _known_level(cls, value: Any) -> Any:
        """Any case (``debug``, ``Debug``); stored upper case, as ``logging`` names them."""
        if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
            raise ValueError(f"{value!r} is not a log level; use one of {', '.join(LOG_LEVELS)} (any case)")
        return value.upper()

    @model_validator(mode="after")
    def _dev_mode_stays_local(self) -> Settings:
        """Dev mode trusts every caller, so it may only listen where no one else can reach (gRPC and every endpoint
        of ``sidecar.config.endpoints`` but those that may: metrics)."""
        if self.auth.effective_mode is AuthMode.DEV:
            addresses = [("server.listen", address) for address in self.server.listen]
            addresses += [(row.key, listen) for row in ENDPOINTS
                          if not row.dev_off_loopback and (listen := row.listen(self)) is not None]
            if self.approvals_ui.oidc is not None:
                raise ValueError("approvals_ui.oidc: signing in through an identity provider needs auth.jwt, which "
                                 "verifies the tokens it issues (auth mode 'dev' trusts a static principal)")
            for key, address in addresses:
                if not parse_listen(address).is_local:
                    raise ValueError(
                        f"{key}: {address!r} is not a loopback address; auth mode 'dev' trusts a static "
                        "principal, so it only listens on 127.0.0.1, ::1, localhost or a unix socket "
                        "(configure auth.jwt to listen elsewhere)")
        return self

    @model_validator(mode="after")
    def _initialize_fits_a_message(self) -> Settings:
        """An MCP ``initialize`` is one message: its own bound, when set, cannot be above the bound of every message
        (the default simply yields to a smaller ``limits.max_message_bytes``)."""
        mcp = self.mcp
        if "max_initialize_bytes" in mcp.model_fields_set and mcp.max_initialize_bytes > self.limits.max_message_bytes:
            raise ValueError(f"mcp.max_initialize_bytes ({self.mcp.max_initialize_bytes}) must be at most "
                             f"limits.max_message_bytes ({self.limits.max_message_bytes}), the bound of every message")
        return self

    @model_validator(mode="after")
    def _a_port_per_worker(self) -> Settings:
        """Worker ``i`` serves an endpoint with a port each (metrics) on its configured port + ``i``: those ports
        must exist."""
        for row in ENDPOINTS:
            listen = row.listen(self)
            if row.workers is not Workers.PORT_EACH or listen is None:
                continue
            port = parse_listen(listen).endpoints[0].port
            if port and port + self.server.workers - 1 > MAX_PORT:
                raise ValueError(f"{row.key}: {listen!r}: with server.workers: {self.server.workers} worker i serves "
                                 f"{row.title} on port {port} + i, beyond {MAX_PORT}: choose lower")
        return self


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (optional; its relative paths are read against its directory, ``sidecar.config.keys``), apply
    environment overrides and validate."""
    raw: dict[str, Any] = {}
    anchored: Anchored = {}
    if path is not None:
        raw = _read_yaml(path)
        anchored = anchor_paths(raw, Settings, path.absolute().parent)
    origins = _apply_env(raw, os.environ if env is None else env)
    return parse_settings(raw, origins=origins, anchored=anchored)


def parse_settings(raw: Mapping[str, Any], *, origins: Origins | None = None,
                   anchored: Anchored | None = None) -> Settings:
    """Validate a mapping, turning pydantic errors into ``ConfigError`` naming each key (and, for a value from
    the environment, the variable that set it; for an unknown key, the known one nearest it)."""
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise describe_errors(exc, origins=origins or {}, model=Settings, anchored=anchored) from None
    settings._origins = dict(origins or {})
    return settings


def describe_errors(exc: ValidationError, *, at: tuple[str, ...] = (), origins: Origins | None = None,
                    model: type[BaseModel] | None = None, anchored: Anchored | None = None) -> ConfigError:
    """One ``ConfigError`` naming every key ``exc`` found wrong, as paths under ``at`` (and, for a value from
    the environment, the variable that set it); never the values themselves. With the ``model`` validated, an
    unknown key names the known key nearest it; ``anchored`` (``sidecar.config.keys``) says which relative paths
    were read against the config file's directory."""
    return ConfigError("\n".join(_describe(err, at, origins or {}, model, anchored or {}) for err in exc.errors()))


def _describe(err: Mapping[str, Any], at: tuple[str, ...], origins: Origins, model: type[BaseModel] | None,
              anchored: Anchored) -> str:
    loc = at + tuple(str(part) for part in err["loc"])
    key = ".".join(loc) or "(top level)"
    message = str(err["msg"]).removeprefix("Value error, ")
    names = [name for path, name in origins.items() if loc and (path[:len(loc)] == loc or loc[:len(path)] == path)]
    if err["type"] == "extra_forbidden":
        message = "unknown key"
        near = close_key(model, loc[len(at):]) if model is not None else None
        message += f" (did you mean {near!r}?)" if near is not None else ""
        if len(loc) == 1 and names:
            message += f"; a plugin's settings are {ENV_PREFIX}PLUGINS__CONFIG__<PLUGIN>__<KEY> (plugins.config)"
    else:
        message += path_note(err["type"], err.get("input"), anchored.get(loc))
    source = f" (from {', '.join(names)})" if names else ""
    return f"config error at {key}{source}: {message}"


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


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """Set the values of the ``TOOLBOOTH_*`` variables in ``raw``; return which variable set which key."""
    origins: dict[tuple[str, ...], str] = {}
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
        origins[tuple(keys)] = name
    return origins
