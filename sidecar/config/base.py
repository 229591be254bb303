"""What every part of the configuration shares: the section base class, keys given inline or as files,
the default paths and the environment variables (listen addresses: ``sidecar.config.listen``)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from sidecar.config.keys import working_directory_note
from sidecar.errors import ConfigError

__all__ = ["CLIENT_VARIABLES", "ENV_CONFIG", "ENV_NO_PROGRESS", "ENV_PREFIX", "ENV_TARGET", "ENV_TLS", "ENV_TLS_CA",
           "ENV_TLS_CERT", "ENV_TLS_KEY", "ENV_TLS_SERVER_NAME", "ENV_TOKEN", "ENV_TOKEN_FILE", "UNIX_PREFIX",
           "KeySource", "Section", "bundled_policy_dir", "default_socket_path", "default_state_dir"]

ENV_PREFIX = "TOOLBOOTH_"
# Read by the command-line client, not settings of the sidecar.
ENV_TARGET, ENV_TOKEN, ENV_TOKEN_FILE = "TOOLBOOTH_TARGET", "TOOLBOOTH_TOKEN", "TOOLBOOTH_TOKEN_FILE"
# The client's TLS (``sidecar.client_tls``): on (a boolean), the CA, the client certificate and key, the server's name.
ENV_TLS, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_SERVER_NAME = (
    "TOOLBOOTH_TLS", "TOOLBOOTH_TLS_CA", "TOOLBOOTH_TLS_CERT", "TOOLBOOTH_TLS_KEY", "TOOLBOOTH_TLS_SERVER_NAME")
# The command line's progress bars off (``sidecar.cli.progress``).
ENV_NO_PROGRESS = "TOOLBOOTH_NO_PROGRESS"
# The config file of every command, when ``--config`` is not given (``sidecar.cli.common.config_flag``).
ENV_CONFIG = "TOOLBOOTH_CONFIG"
CLIENT_VARIABLES = frozenset({ENV_CONFIG, ENV_TARGET, ENV_TOKEN, ENV_TOKEN_FILE, ENV_TLS, ENV_TLS_CA, ENV_TLS_CERT,
                              ENV_TLS_KEY, ENV_TLS_SERVER_NAME, ENV_NO_PROGRESS})
UNIX_PREFIX = "unix://"


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
    here = Path(__file__).resolve().parent.parent
    bundled = here / "_bundled_policies" / "toolbooth"
    return bundled if bundled.is_dir() else here.parent / "policies" / "toolbooth"


class Section(BaseModel):
    """A part of the configuration: unknown keys are errors, values never change once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class KeySource(Section):
    """A key given inline (``key``) or as a file (``key_file``): exactly one of them."""

    key: str | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _one_key(self) -> KeySource:
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
            raise ConfigError(f"config error at {where}.key_file: cannot read {self.key_file}: "
                              f"{exc.strerror}{working_directory_note(self.key_file)}") from None
