"""The PostgreSQL backend, for replicas sharing one database: a driver (psycopg 3 async pool) and its migrations.

Migrations are ``sidecar/state/migrations/postgres/NNNN_*.sql``. Importing this imports psycopg:
``backends`` does so only when PostgreSQL is configured.
"""

from __future__ import annotations

from sidecar.state.postgres.driver import POSTGRES, PostgresDriver
from sidecar.state.postgres.store import PostgresStore

__all__ = ["POSTGRES", "PostgresDriver", "PostgresStore"]
