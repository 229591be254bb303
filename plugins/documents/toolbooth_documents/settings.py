"""Where the document index is: ``plugins.config.documents`` of the sidecar's configuration (``IndexSettings``).

- ``postgres_dsn``: a PostgreSQL database; when set, the index lives there (full-text search with
  ``tsvector``/``tsquery`` and a GIN index), shared by every sidecar pointed at it.
- ``sqlite_path``: else, the SQLite file of the index (FTS5); default ``$XDG_STATE_HOME/toolbooth/documents.db``
  (``~/.local/state/toolbooth/documents.db``), next to the sidecar's own state.
- ``cursor_key_file``: the key that signs cursors (at least 16 bytes); default: a random key the
  index generates once and keeps in its own database, so every sidecar sharing the index accepts the
  cursors of the others.

Each can be set by ``TOOLBOOTH_PLUGINS__CONFIG__DOCUMENTS__<KEY>`` too (``docs/plugins.md``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["MIN_CURSOR_KEY_BYTES", "ConfigurationError", "IndexSettings"]

MIN_CURSOR_KEY_BYTES = 16


class ConfigurationError(ValueError):
    """The index is configured wrongly; the message names the key or option and what is wrong."""


def _default_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbooth" / "documents.db"


class IndexSettings(BaseModel):
    """One index: a SQLite file, or a PostgreSQL database when ``postgres_dsn`` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sqlite_path: Path = Field(default_factory=_default_path)
    postgres_dsn: SecretStr | None = Field(default=None, min_length=1)
    cursor_key_file: Path | None = None

    @field_validator("postgres_dsn")
    @classmethod
    def _a_connection_string(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            import psycopg  # loads only for a PostgreSQL index
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(value.get_secret_value())
            except psycopg.ProgrammingError as exc:  # names the bad part, never the password
                raise ValueError(f"not a PostgreSQL connection string: {' '.join(str(exc).split())}") from None
        return value

    @field_validator("cursor_key_file")
    @classmethod
    def _a_usable_key(cls, value: Path | None) -> Path | None:
        if value is not None:
            _read_key(value)
        return value

    @property
    def dsn(self) -> str | None:
        """The PostgreSQL connection string, ``None`` for SQLite."""
        return None if self.postgres_dsn is None else self.postgres_dsn.get_secret_value()

    def describe(self) -> str:
        """The index in one line, for people: never with the database password."""
        if self.dsn is None:
            return f"sqlite {self.sqlite_path}"
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(self.dsn)
        if "password" in parts:
            parts["password"] = "***"
        return f"postgres {make_conninfo(**{k: str(v) for k, v in parts.items()})}"

    def read_cursor_key(self) -> bytes | None:
        """The configured cursor key, ``None`` if none is; ``ConfigurationError`` if its file has become unusable
        (it was checked when the settings were validated)."""
        if self.cursor_key_file is None:
            return None
        try:
            return _read_key(self.cursor_key_file)
        except ValueError as exc:
            raise ConfigurationError(f"plugins.config.documents.cursor_key_file: {exc}") from None


def _read_key(path: Path) -> bytes:
    """The key in ``path``; ``ValueError`` saying why it cannot be used."""
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_CURSOR_KEY_BYTES:
        raise ValueError(f"{path} holds fewer than {MIN_CURSOR_KEY_BYTES} bytes")
    return key
