"""Where the document index is, from ``TBDOCS_*`` environment variables (the sidecar has no plugin settings).

- ``TBDOCS_POSTGRES_DSN``: a PostgreSQL database; when set, the index lives there (full-text search with
  ``tsvector``/``tsquery`` and a GIN index), shared by every sidecar pointed at it.
- ``TBDOCS_DB``: else, the SQLite file of the index (FTS5); default ``$XDG_STATE_HOME/toolbooth/documents.db``
  (``~/.local/state/toolbooth/documents.db``), next to the sidecar's own state.
- ``TBDOCS_CURSOR_KEY_FILE``: the key that signs cursors (at least 16 bytes); default: a random key the
  index generates once and keeps in its own database, so every sidecar sharing the index accepts the
  cursors of the others.

The prefix is not ``TOOLBOOTH_``: the sidecar reads every ``TOOLBOOTH_*`` variable as a setting of its own
and refuses the ones it does not know.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["ENV_CURSOR_KEY_FILE", "ENV_DB", "ENV_POSTGRES_DSN", "MIN_CURSOR_KEY_BYTES", "ConfigurationError",
           "IndexSettings"]

ENV_DB = "TBDOCS_DB"
ENV_POSTGRES_DSN = "TBDOCS_POSTGRES_DSN"
ENV_CURSOR_KEY_FILE = "TBDOCS_CURSOR_KEY_FILE"
MIN_CURSOR_KEY_BYTES = 16


class ConfigurationError(ValueError):
    """The index is configured wrongly; the message names the variable or option and what is wrong."""


@dataclass(frozen=True, slots=True)
class IndexSettings:
    """One index: a SQLite file, or a PostgreSQL database when ``postgres_dsn`` is set."""

    sqlite_path: Path
    postgres_dsn: str | None = None
    cursor_key_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, db: Path | None = None,
                 postgres_dsn: str | None = None) -> IndexSettings:
        """The settings of ``env`` (default ``os.environ``); ``db`` or ``postgres_dsn`` (the indexer's options)
        name the index instead."""
        env = os.environ if env is None else env
        dsn = postgres_dsn or (None if db else env.get(ENV_POSTGRES_DSN)) or None
        if dsn is not None:
            try:
                conninfo_to_dict(dsn)
            except psycopg.ProgrammingError as exc:  # names the bad part, never the password
                source = "--postgres-dsn" if postgres_dsn else ENV_POSTGRES_DSN
                raise ConfigurationError(f"{source}: not a PostgreSQL connection string: "
                                         f"{' '.join(str(exc).split())}") from None
        path = db or (Path(env[ENV_DB]) if env.get(ENV_DB) else _default_path(env))
        key_file = env.get(ENV_CURSOR_KEY_FILE)
        return cls(sqlite_path=path, postgres_dsn=dsn, cursor_key_file=Path(key_file) if key_file else None)

    def describe(self) -> str:
        """The index in one line, for people: never with the database password."""
        if self.postgres_dsn is None:
            return f"sqlite {self.sqlite_path}"
        parts = conninfo_to_dict(self.postgres_dsn)
        if "password" in parts:
            parts["password"] = "***"
        return f"postgres {make_conninfo(**{k: str(v) for k, v in parts.items()})}"

    def read_cursor_key(self) -> bytes | None:
        """The configured cursor key, ``None`` if none is; ``ConfigurationError`` if its file is unusable."""
        if self.cursor_key_file is None:
            return None
        try:
            key = self.cursor_key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigurationError(f"{ENV_CURSOR_KEY_FILE}: cannot read {self.cursor_key_file}: "
                                     f"{exc.strerror or exc}") from None
        if len(key) < MIN_CURSOR_KEY_BYTES:
            raise ConfigurationError(f"{ENV_CURSOR_KEY_FILE}: {self.cursor_key_file} holds fewer than "
                                     f"{MIN_CURSOR_KEY_BYTES} bytes")
        return key


def _default_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "toolbooth" / "documents.db"
