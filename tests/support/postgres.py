"""A PostgreSQL server for tests: one fresh database per session, one fresh schema per test.

``TOOLBOOTH_TEST_POSTGRES_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``) names a
database the tests may connect to and create databases from; nothing else needs setting up.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import QueryNoTemplate
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ADMIN_DSN = os.environ.get("TOOLBOOTH_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
# Added to every DSN the tests hand to a store: trust authentication ignores it, and no message may show it.
PASSWORD = "pw-never-shown-4b1d"


class PostgresServer:
    """A database of its own on the test server, dropped by ``drop``."""

    def __init__(self, admin_dsn: str, dbname: str) -> None:
        self.admin_dsn, self.dbname = admin_dsn, dbname
        self._schemas = 0

    @classmethod
    def create(cls, admin_dsn: str = ADMIN_DSN) -> PostgresServer:
        """Create a uniquely named database (``psycopg.OperationalError`` if the server is unreachable)."""
        dbname = f"toolbooth_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        return cls(admin_dsn, dbname)

    def drop(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.dbname)))

    def new_schema(self) -> str:
        """The DSN of a new, empty schema in this database (first on its ``search_path``)."""
        self._schemas += 1
        schema = f"test_{self._schemas}"
        self.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        return self.dsn(f"-c search_path={schema}")

    def dsn(self, options: str = "") -> str:
        """A DSN of this database, with ``PASSWORD`` and the server ``options`` (``-c name=value ...``)."""
        extra = {"options": options} if options else {}
        return make_conninfo(self.admin_dsn, dbname=self.dbname, password=PASSWORD, **extra)

    def execute(self, query: QueryNoTemplate, params: tuple[Any, ...] = (), *,
                dsn: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on its own connection (to ``dsn``, else this database) and return its rows."""
        with psycopg.connect(dsn or self.dsn(), autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []


def closed_port_dsn(dsn: str) -> str:
    """``dsn`` pointed at a local port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return make_conninfo(dsn, host="127.0.0.1", port=port)


def with_options(dsn: str, *options: str) -> str:
    """``dsn`` with more server ``options`` (``-c name=value``) after its own."""
    current = str(conninfo_to_dict(dsn).get("options", ""))
    return make_conninfo(dsn, options=" ".join([current, *options]).strip())
