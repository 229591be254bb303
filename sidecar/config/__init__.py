"""The one configuration model: a YAML file plus ``TOOLBOOTH_*`` environment overrides.

Validated at start; every error names the key that is wrong, e.g.
``config error at limits.max_argument_bytes: Input should be greater than 0``.
Environment variables override file values: ``TOOLBOOTH_STORE__SQLITE_PATH=/x.db``
sets ``store.sqlite_path`` (sections and keys joined by a double underscore; values
are parsed as YAML, so ``[a, b]`` is a list and ``true`` a boolean).
"""

from __future__ import annotations

from sidecar.config.approvals_ui import ApprovalsUiSettings, OidcSettings
from sidecar.config.auth import AuthMode, AuthSettings, JwtSettings
from sidecar.config.base import (
    CLIENT_VARIABLES,
    ENV_CONFIG,
    ENV_NO_PROGRESS,
    ENV_PREFIX,
    ENV_TARGET,
    ENV_TLS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TLS_SERVER_NAME,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    UNIX_PREFIX,
    bundled_policy_dir,
    default_socket_path,
    default_state_dir,
)
from sidecar.config.http_json import CALL_PATH, HttpJsonSettings
from sidecar.config.isolation import IsolationSettings
from sidecar.config.listen import (
    LISTEN_FORMS,
    ListenAddress,
    ListenKind,
    client_target,
    is_loopback,
    parse_listen,
    socket_path,
)
from sidecar.config.logs import LogFormat, LoggingSettings
from sidecar.config.mcp import MCP_PATH, McpSettings
from sidecar.config.metrics import METRICS_PATH, MetricsSettings
from sidecar.config.policy import (
    BundleKeySettings,
    BundleSettings,
    BundleVerificationSettings,
    DecisionCacheSettings,
    OpaSettings,
    OpaTlsSettings,
    PolicyEngineKind,
    PolicySettings,
)
from sidecar.config.settings import (
    MAX_WORKERS,
    MIN_MASK_KEY_BYTES,
    AuditSettings,
    Limits,
    PluginSettings,
    ServerSettings,
    Settings,
    StoreSettings,
    load_settings,
    parse_settings,
)
from sidecar.config.tls import ServerTlsSettings

__all__ = [
    "CALL_PATH",
    "CLIENT_VARIABLES",
    "ENV_CONFIG",
    "ENV_NO_PROGRESS",
    "ENV_PREFIX",
    "ENV_TARGET",
    "ENV_TLS",
    "ENV_TLS_CA",
    "ENV_TLS_CERT",
    "ENV_TLS_KEY",
    "ENV_TLS_SERVER_NAME",
    "ENV_TOKEN",
    "ENV_TOKEN_FILE",
    "LISTEN_FORMS",
    "MAX_WORKERS",
    "MCP_PATH",
    "METRICS_PATH",
    "MIN_MASK_KEY_BYTES",
    "UNIX_PREFIX",
    "ApprovalsUiSettings",
    "AuditSettings",
    "AuthMode",
    "AuthSettings",
    "BundleKeySettings",
    "BundleSettings",
    "BundleVerificationSettings",
    "DecisionCacheSettings",
    "HttpJsonSettings",
    "IsolationSettings",
    "JwtSettings",
    "Limits",
    "ListenAddress",
    "ListenKind",
    "LogFormat",
    "LoggingSettings",
    "McpSettings",
    "MetricsSettings",
    "OidcSettings",
    "OpaSettings",
    "OpaTlsSettings",
    "PluginSettings",
    "PolicyEngineKind",
    "PolicySettings",
    "ServerSettings",
    "ServerTlsSettings",
    "Settings",
    "StoreSettings",
    "bundled_policy_dir",
    "client_target",
    "default_socket_path",
    "default_state_dir",
    "is_loopback",
    "load_settings",
    "parse_listen",
    "parse_settings",
    "socket_path",
]
