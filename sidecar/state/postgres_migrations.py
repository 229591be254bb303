"""Versioned PostgreSQL schema: ordered SQL files, each applied once, under an advisory lock.

``migrations/postgres/NNNN_name.sql`` is version NNNN (1, 2, 3, ... without gaps). Table
``toolbooth_schema`` lists the versions applied. Every run holds one transaction-scoped
advisory lock, so sidecars starting together apply each pending version exactly once;
a failing migration rolls back with everything else of its run.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from typing import Any, LiteralString

from psycopg import AsyncConnection

from sidecar.errors import StoreUnavailableError

# pg_advisory_xact_lock key: "toolboot" in ASCII, so other applications' locks are unlikely to collide.
MIGRATION_LOCK = int.from_bytes(b"toolboot", "big")

_CREATE_SCHEMA_TABLE = """
CREATE TABLE toolbooth_schema (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped, by version; ``RuntimeError`` if the versions are not 1..N."""
    folder = files("sidecar.state") / "migrations" / "postgres"
    found = sorted(
        (Migration(int(entry.name[:4]), entry.name.removesuffix(".sql"), entry.read_text())
         for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"PostgreSQL migrations must be numbered 1..N: {[m.name for m in found]}")
    return found


async def migrate(conn: AsyncConnection[Any]) -> int:
    """Apply the pending migrations on ``conn`` (autocommit mode); return the schema version."""
    known = migrations()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        current = await _current_version(conn)
        if current > len(known):
            raise StoreUnavailableError(f"the database schema is at version {current}, newer than this sidecar's "
                                        f"{len(known)}; upgrade the sidecar")
        for migration in known[current:]:
            await conn.execute(migration.sql)
            await conn.execute("INSERT INTO toolbooth_schema (version, name) VALUES (%s, %s)",
                               (migration.version, migration.name))
    return len(known)


async def _current_version(conn: AsyncConnection[Any]) -> int:
    """The highest version applied; creates ``toolbooth_schema`` in a new database (version 0)."""
    if not await _scalar(conn, "SELECT to_regclass('toolbooth_schema') IS NOT NULL"):
        await conn.execute(_CREATE_SCHEMA_TABLE)
        return 0
    return int(await _scalar(conn, "SELECT coalesce(max(version), 0) FROM toolbooth_schema"))


async def _scalar(conn: AsyncConnection[Any], query: LiteralString) -> Any:
    row = await (await conn.execute(query)).fetchone()
    assert row is not None  # both queries are aggregates or constants: always one row
    return row[0]
