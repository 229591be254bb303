"""The ``store`` section: a SQLite file by default, or a PostgreSQL database shared by replicas.

``StoreSettings.kind`` is the one place that tells which backend the settings name; what differs between
the backends' settings (the database's identity, the default places of the local journal and the audit
checkpoint, the store in one line) is one row of ``_BACKENDS`` each. The stores themselves, by kind, are
``sidecar.state.backends``.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from sidecar.config.base import Section, default_state_dir
from sidecar.config.dsn import dsn_parts, redact_dsn

__all__ = ["StoreKind", "StoreSettings"]


class StoreKind(StrEnum):
    """The backend of a store."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


class StoreSettings(Section):
    """A SQLite file by default; a PostgreSQL database, shared by many replicas, when ``postgres_dsn`` is set."""

    sqlite_path: Path = Field(default_factory=lambda: default_state_dir() / "toolbooth.db")
    busy_timeout_ms: int = Field(default=5000, gt=0)  # lock wait: SQLite's busy timeout, PostgreSQL's lock_timeout
    postgres_dsn: SecretStr | None = Field(default=None, min_length=1)
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, gt=0)
    connect_timeout_seconds: float = Field(default=5.0, gt=0)  # also the wait for a free pooled connection
    # PostgreSQL: a statement without an answer this long fails (its connection severed), on the server too
    statement_timeout_seconds: float = Field(default=10.0, gt=0)
    # PostgreSQL: while the database cannot be reached, a call waits this long for a connection, then fails
    down_wait_seconds: float = Field(default=0.2, gt=0)
    idempotency_retention_hours: float = Field(default=24.0, gt=0)  # finished records are deleted after this
    # the call history policies read (meters, conversations' labels, failures) is kept this long, then deleted
    history_retention_hours: float = Field(default=168.0, gt=0, le=366 * 24)
    # queued audit events (outcomes) gather this long to share one commit; a crash loses at most these
    audit_linger_ms: float = Field(default=10.0, ge=0, le=1000)
    # outcomes and audit events the store cannot take are kept here until it is back (a local file, not the store)
    journal_file: Path | None = None

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

    @model_validator(mode="after")
    def _statements_outlast_lock_waits(self) -> StoreSettings:
        if self.statement_timeout_seconds * 1000 <= self.busy_timeout_ms:
            raise ValueError(f"statement_timeout_seconds ({self.statement_timeout_seconds}) must be longer than "
                             f"busy_timeout_ms ({self.busy_timeout_ms} ms): a statement may wait that long for a lock")
        return self

    @model_validator(mode="after")
    def _down_wait_within_the_pool_wait(self) -> StoreSettings:
        if self.down_wait_seconds > self.connect_timeout_seconds:
            raise ValueError(f"down_wait_seconds ({self.down_wait_seconds}) must not be longer than "
                             f"connect_timeout_seconds ({self.connect_timeout_seconds}), the wait for a connection "
                             "while the database answers")
        return self

    @property
    def kind(self) -> StoreKind:
        """PostgreSQL when ``postgres_dsn`` is set, else SQLite."""
        return StoreKind.SQLITE if self.postgres_dsn is None else StoreKind.POSTGRES

    def dsn(self) -> str:
        """The PostgreSQL DSN, with its password (the settings of a ``postgres`` store only)."""
        assert self.postgres_dsn is not None, "only a postgres store has a DSN"
        return self.postgres_dsn.get_secret_value()

    def identity(self) -> str:
        """Which database this is (the SQLite file; PostgreSQL's user, server and database): the local journal
        belongs to it."""
        return _BACKENDS[self.kind].identity(self)

    def journal_path(self) -> Path:
        """``journal_file``, else ``<sqlite file>.journal`` (SQLite) or ``store-<digest of identity>.journal`` in
        the state directory (PostgreSQL)."""
        return self.journal_file or _BACKENDS[self.kind].journal(self)

    def checkpoint_path(self) -> Path:
        """Where the audit checkpoint is kept unless ``audit.checkpoint_file`` says: ``<sqlite file>.checkpoint``
        (SQLite) or ``audit.checkpoint`` in the state directory (PostgreSQL)."""
        return _BACKENDS[self.kind].checkpoint(self)

    def describe(self) -> str:
        """The store in one line, for people: never with the database password."""
        return _BACKENDS[self.kind].describe(self)


class _Backend(Protocol):
    """What differs between the backends' settings."""

    def identity(self, store: StoreSettings) -> str: ...

    def journal(self, store: StoreSettings) -> Path: ...

    def checkpoint(self, store: StoreSettings) -> Path: ...

    def describe(self, store: StoreSettings) -> str: ...


class _Sqlite:
    """A local file; the journal and the checkpoint beside it."""

    def identity(self, store: StoreSettings) -> str:
        return f"sqlite {store.sqlite_path.resolve()}"

    def journal(self, store: StoreSettings) -> Path:
        return store.sqlite_path.with_name(store.sqlite_path.name + ".journal")

    def checkpoint(self, store: StoreSettings) -> Path:
        return store.sqlite_path.with_name(store.sqlite_path.name + ".checkpoint")

    def describe(self, store: StoreSettings) -> str:
        return f"sqlite {store.sqlite_path}"


class _Postgres:
    """A shared database; this sidecar's journal and checkpoint in its state directory."""

    def identity(self, store: StoreSettings) -> str:
        return redact_dsn(store.dsn())

    def journal(self, store: StoreSettings) -> Path:
        return default_state_dir() / f"store-{hashlib.sha256(self.identity(store).encode()).hexdigest()[:16]}.journal"

    def checkpoint(self, store: StoreSettings) -> Path:
        return default_state_dir() / "audit.checkpoint"

    def describe(self, store: StoreSettings) -> str:
        return f"postgres {redact_dsn(store.dsn())} (pool {store.pool_min_size}-{store.pool_max_size})"


_BACKENDS: dict[StoreKind, _Backend] = {StoreKind.SQLITE: _Sqlite(), StoreKind.POSTGRES: _Postgres()}
