"""Versioned schemas: per backend, ordered SQL files, each applied once, recorded in the database.

``migrations/<backend>/NNNN_name.sql`` is version NNNN (1, 2, 3, ... without gaps); both backends
number the same changes alike. Table ``toolbooth_schema`` lists the versions applied (PostgreSQL
databases of earlier releases already have it). A run is one transaction holding ``MIGRATION_LOCK``,
so sidecars starting together apply each pending version exactly once, and a failing migration
rolls back with everything else of its run. A database newer than this sidecar is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from sidecar.errors import StoreUnavailableError
from sidecar.state.driver import Driver

__all__ = ["MIGRATION_LOCK", "Migration", "migrate", "migrations"]

# The lock key: "toolboot" in ASCII, so other applications' locks are unlikely to collide.
MIGRATION_LOCK = int.from_bytes(b"toolboot", "big")


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema change: its version, its file's name without ``.sql``, its statements."""

    version: int
    name: str
    sql: str


def migrations(backend: str) -> list[Migration]:
    """Every migration shipped for ``backend``, by version; ``RuntimeError`` if the versions are not 1..N."""
    folder = files("sidecar.state") / "migrations" / backend
    found = sorted(
        (Migration(int(entry.name[:4]), entry.name.removesuffix(".sql"), entry.read_text())
         for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda m: m.version)
    if not found or [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{backend} migrations must be numbered 1..N: {[m.name for m in found]}")
    return found


async def migrate(driver: Driver, *, target: int | None = None) -> int:
    """Apply the pending migrations of ``driver``'s backend, up to version ``target`` (default: all);
    return the schema version."""
    known = migrations(driver.dialect.name)[:target]
    sql = driver.dialect.sql
    async with driver.transaction(lock=MIGRATION_LOCK) as tx:
        [(exists,)] = await tx.fetch(sql(driver.dialect.table_exists), ("toolbooth_schema",))
        if not exists:  # checked first: a read-only replica of a migrated database must still open
            await tx.execute(driver.dialect.version_table)
        [(current,)] = await tx.fetch("SELECT coalesce(max(version), 0) FROM toolbooth_schema")
        if current > len(known) and target is None:
            raise StoreUnavailableError(f"the database schema is at version {current}, newer than this sidecar's "
                                        f"{len(known)}; upgrade the sidecar")
        for migration in known[current:]:
            await tx.execute_script(migration.sql)
            await tx.execute(sql("INSERT INTO toolbooth_schema (version, name) VALUES (?, ?)"),
                             (migration.version, migration.name))
    return max(int(current), len(known))
