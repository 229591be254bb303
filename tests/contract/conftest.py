"""The PostgreSQL server for the store tests: required when ``CI=true``, else skipped if unreachable."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from sidecar.config.dsn import redact_dsn
from tests.support.postgres import ADMIN_DSN, PostgresServer
from tests.support.required import missing


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A database for this session on the test server, dropped at the end."""
    try:
        server = PostgresServer.create()
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at {redact_dsn(ADMIN_DSN)} is unreachable: {' '.join(str(exc).split())}"
        missing(message, install="the machine's PostgreSQL at 127.0.0.1:5432, trust auth")
    yield server
    server.drop()


@pytest.fixture
def postgres_dsn(postgres: PostgresServer) -> str:
    """The DSN of an empty schema of this test's own."""
    return postgres.new_schema()
